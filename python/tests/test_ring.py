"""The Ketama ring: construction rules, lookup and balance (no library needed)."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from dfkv.ring import LEGACY_POINTS_PER_WEIGHT, MAX_WEIGHT, POINTS_PER_WEIGHT, Node, Ring


def test_empty_ring():
    r = Ring([])
    assert len(r) == 0
    assert r.owner(123) == (-1, "")
    assert r.shares() == {}


def test_nodes_sorted_and_indexed_by_id():
    r = Ring([("b", 1), Node("a", 2), "c"])
    assert [n.id for n in r.nodes] == ["a", "b", "c"]
    idx, nid = r.owner(0)
    assert r.nodes[idx].id == nid


@pytest.mark.parametrize("nodes", [[("", 1)], [("a", 1), ("a", 2)], [("a", 0)], [("a", MAX_WEIGHT + 1)],
                                   [("a", True)]])
def test_rejects_bad_nodes(nodes):
    with pytest.raises(ValueError):
        Ring(nodes)


def test_points_follow_definition():
    # The first point of node "n1" is the first LE u64 of SHA-256("n1#0"); it must own itself.
    h = struct.unpack_from("<Q", hashlib.sha256(b"n1#0").digest())[0]
    r = Ring([("n1", 1), ("n2", 1)])
    assert r.owner(h) == (0, "n1")
    assert len(r._hashes) == 2 * POINTS_PER_WEIGHT
    assert len(Ring([("n1", 1), ("n2", 3)], LEGACY_POINTS_PER_WEIGHT)._hashes) == 4 * LEGACY_POINTS_PER_WEIGHT


@pytest.mark.parametrize("ppw", [0, 2, 162, 8192, True, "1024"])
def test_rejects_bad_density(ppw):
    with pytest.raises(ValueError):
        Ring(["a"], ppw)


def test_wraps_past_last_point():
    r = Ring([("a", 1), ("b", 1)])
    first_owner = r.nodes[r._owners[0]].id
    assert r.owner(r._hashes[-1] + 1)[1] == first_owner  # past the last point: wrap to the first
    assert r.owner(0)[1] == first_owner


def test_shares_follow_weights():
    shares = Ring([("a", 1), ("b", 2), ("c", 1)]).shares()
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert 0.40 < shares["b"] < 0.60
    assert 0.15 < shares["a"] < 0.35


def test_adding_a_node_moves_about_one_nth():
    rnd = random.Random(7)
    hs = [rnd.getrandbits(64) for _ in range(20000)]
    before = Ring([f"n{i}" for i in range(4)])
    after = Ring([f"n{i}" for i in range(5)])
    moved = sum(before.owner(h)[1] != after.owner(h)[1] for h in hs)
    assert 0.10 < moved / len(hs) < 0.30
    # Keys that moved all moved to the new node.
    assert all(after.owner(h)[1] == "n4" for h in hs if before.owner(h)[1] != after.owner(h)[1])
