"""Weighted Ketama ring, identical to ``go/ring`` (checked by the shared golden vectors).

A node of weight w gets ``P*w`` points (P = points per weight: 1,024 by default, 160 for the
first releases' placement ring and for the disk ring): P*w/4 SHA-256 digests of
``f"{id}#{d}"`` (d = 0, 1, ...), each split into four little-endian u64 points. Points are sorted by
(hash, node index) with nodes indexed in id order, so ties resolve identically in every
language. The owner of position h is the node of the first point >= h, wrapping around.

Placement uses the object id: ``ring.owner(oid.hi)`` picks the node, and the node's disk ring
picks the disk with ``disks.owner(oid.lo)``. Python uses this for tools and tests; the client
library routes by itself.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from typing import Dict, Iterable, List, NamedTuple, Tuple, Union

__all__ = ["Node", "Ring", "POINTS_PER_WEIGHT", "LEGACY_POINTS_PER_WEIGHT", "MAX_POINTS_PER_WEIGHT", "MAX_WEIGHT"]

POINTS_PER_WEIGHT = 1024
LEGACY_POINTS_PER_WEIGHT = 160
MAX_POINTS_PER_WEIGHT = 4096
MAX_WEIGHT = 100

_POINTS = struct.Struct("<4Q")


class Node(NamedTuple):
    id: str
    weight: int = 1


def _id_key(node_id: str) -> bytes:
    # Go compares strings bytewise; UTF-8 byte order equals code point order, but be explicit.
    return node_id.encode("utf-8")


class Ring:
    """Immutable ring over nodes given as ``Node``, ``(id, weight)`` pairs or bare ids."""

    def __init__(self, nodes: Iterable[Union[Node, Tuple[str, int], str]],
                 points_per_weight: int = POINTS_PER_WEIGHT):
        ppw = points_per_weight
        if isinstance(ppw, bool) or not isinstance(ppw, int) or not 4 <= ppw <= MAX_POINTS_PER_WEIGHT or ppw % 4:
            raise ValueError(f"ring: {ppw!r} points per weight: want a multiple of 4 in 4..{MAX_POINTS_PER_WEIGHT}")
        self.points_per_weight = ppw
        norm: List[Node] = []
        for n in nodes:
            norm.append(Node(n, 1) if isinstance(n, str) else Node(*n))
        norm.sort(key=lambda n: _id_key(n.id))
        for i, n in enumerate(norm):
            if not isinstance(n.id, str) or n.id == "":
                raise ValueError("ring: empty node id")
            if i and norm[i - 1].id == n.id:
                raise ValueError(f"ring: duplicate node id {n.id!r}")
            if isinstance(n.weight, bool) or not isinstance(n.weight, int) or not 1 <= n.weight <= MAX_WEIGHT:
                raise ValueError(f"ring: node {n.id!r} weight {n.weight!r} out of range 1..{MAX_WEIGHT}")
        self._nodes = tuple(norm)
        points: List[Tuple[int, int]] = []
        for idx, n in enumerate(norm):
            prefix = _id_key(n.id) + b"#"
            for d in range(n.weight * ppw // 4):
                digest = hashlib.sha256(prefix + str(d).encode("ascii")).digest()
                for h in _POINTS.unpack_from(digest):
                    points.append((h, idx))
        points.sort()
        self._hashes = [p[0] for p in points]
        self._owners = [p[1] for p in points]

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> Tuple[Node, ...]:
        """Members sorted by id (indices returned by ``owner`` refer to this order)."""
        return self._nodes

    def owner(self, h: int) -> Tuple[int, str]:
        """(index, id) of the node owning position ``h``; (-1, "") for an empty ring."""
        if not self._hashes:
            return -1, ""
        i = bisect.bisect_left(self._hashes, h)
        if i == len(self._hashes):
            i = 0
        idx = self._owners[i]
        return idx, self._nodes[idx].id

    def shares(self) -> Dict[str, float]:
        """Each node's fraction of the 64-bit hash space."""
        out = {n.id: 0.0 for n in self._nodes}
        if not self._hashes:
            return out
        prev = self._hashes[-1]
        for h, idx in zip(self._hashes, self._owners):
            # The arc (prev, h] belongs to this point; the modulo handles the wrap.
            out[self._nodes[idx].id] += ((h - prev) % (1 << 64)) / float(1 << 64)
            prev = h
        return out
