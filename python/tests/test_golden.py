"""Shared golden vectors (testdata/golden/identity.json), also checked by go/identity.

Every vector's object id, tenant hash, node owner (ring by id.hi) and disk owner (disk ring by
id.lo) must match; structured vectors must also re-encode to the stored namespace/key bytes.
"""

from __future__ import annotations

import json

import pytest
from conftest import GOLDEN

from dfkv.identity import Namespace, ObjectKey, object_id, tenant_hash
from dfkv.ring import LEGACY_POINTS_PER_WEIGHT, Ring

DATA = json.loads(GOLDEN.read_text())
NODE_RING = Ring([(n["id"], n["weight"]) for n in DATA["ring"]], LEGACY_POINTS_PER_WEIGHT)
NODE_RING_1024 = Ring([(n["id"], n["weight"]) for n in DATA["ring"]])  # the default density
DISK_RING = Ring([(n["id"], n["weight"]) for n in DATA["disks"]], LEGACY_POINTS_PER_WEIGHT)
VECTORS = DATA["vectors"]
STRUCTURED = [v for v in VECTORS if v.get("structured")]


def test_file_has_enough_vectors():
    assert len(VECTORS) >= 8
    assert len(STRUCTURED) >= 10
    assert len({v["name"] for v in VECTORS}) == len(VECTORS), "vector names must be unique"


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_outputs(v):
    for f in ("object_id", "tenant_hash", "ring_owner", "ring1024_owner", "disk_owner"):
        assert v[f], f"{v['name']}: {f} is empty; run testdata/golden/gen_golden.py --write for a new vector"
    oid = object_id(bytes.fromhex(v["namespace_hex"]), bytes.fromhex(v["key_hex"]))
    assert oid.hex() == v["object_id"]
    assert f"{tenant_hash(bytes.fromhex(v['tenant_hex'])):016x}" == v["tenant_hash"]
    assert NODE_RING.owner(oid.hi)[1] == v["ring_owner"]
    assert NODE_RING_1024.owner(oid.hi)[1] == v["ring1024_owner"]
    assert DISK_RING.owner(oid.lo)[1] == v["disk_owner"]


@pytest.mark.parametrize("v", STRUCTURED, ids=[v["name"] for v in STRUCTURED])
def test_structured_encoding(v):
    s = v["structured"]
    ns = Namespace.from_json(s["namespace"])
    key = ObjectKey.from_json(s["key"])
    assert ns.encode().hex() == v["namespace_hex"]
    assert key.encode().hex() == v["key_hex"]
    assert ns.tenant.encode("utf-8").hex() == v["tenant_hex"]
    # Decoding the stored bytes gives back the same inputs.
    assert Namespace.decode(bytes.fromhex(v["namespace_hex"])).to_json() == ns.to_json()
    assert ObjectKey.decode(bytes.fromhex(v["key_hex"])).to_json() == key.to_json()
