"""Identity hashes and the structured namespace / object-key codec (no library needed)."""

from __future__ import annotations

import hashlib
import struct

import pytest

from dfkv.identity import (
    NAMESPACE_MAGIC,
    OBJECT_KEY_MAGIC,
    REPLICATED,
    Namespace,
    ObjectKey,
    ScatterGather,
    decode_namespace,
    decode_object_key,
    encode_namespace,
    encode_object_key,
    key_builder,
    object_id,
    tenant_hash,
)

NS = dict(model="m/x", layout="sglang-hicache/raw-v1", dtype="bfloat16", page_tokens=64,
          page_bytes=4096, tenant="acme", revision="r1", fingerprint=b"\x01\x02",
          geometry={"num_layers": 2, "head_dim": 128}, tp=4)
KEY = dict(pool="kv", page_hash=b"\x00hash\xff", component="k", tp=(4, 1))


def test_object_id_matches_definition():
    ns, key = b"n\x00s", b"k\x00"
    d = hashlib.sha256(struct.pack("<Q", 3) + ns + struct.pack("<Q", 2) + key).digest()
    oid = object_id(ns, key)
    assert oid == (int.from_bytes(d[:8], "big"), int.from_bytes(d[8:16], "big"))
    assert oid.hex() == d[:16].hex()
    assert object_id(bytearray(ns), memoryview(key)) == oid


def test_object_id_framing_separates_boundaries():
    assert object_id(b"ab", b"c") != object_id(b"a", b"bc")
    assert object_id(b"", b"x") != object_id(b"x", b"")


def test_tenant_hash():
    d = hashlib.sha256(b"DFKVTENANT1" + struct.pack("<Q", 4) + b"acme").digest()
    assert tenant_hash(b"acme") == int.from_bytes(d[:8], "big")
    assert tenant_hash("acme") == tenant_hash(b"acme")


def test_namespace_exact_bytes():
    # Pins the documented layout byte for byte (a format change must fail here first).
    ns = Namespace(model="m", layout="l", dtype="d", page_tokens=2, page_bytes=3, tenant="t",
                   geometry={"b": 5, "a": 4}, dp=1, tp=2, pcp=1, dcp=1, pp=3)
    lp = lambda b: struct.pack("<I", len(b)) + b  # noqa: E731
    want = (NAMESPACE_MAGIC + lp(b"t") + lp(b"m") + lp(b"") + lp(b"l") + lp(b"d") + lp(b"")
            + struct.pack("<QQ", 2, 3) + struct.pack("<I", 2)
            + lp(b"a") + struct.pack("<Q", 4) + lp(b"b") + struct.pack("<Q", 5)
            + struct.pack("<5I", 1, 2, 1, 1, 3))
    assert ns.encode() == want


def test_object_key_exact_bytes():
    k = ObjectKey(pool="kv", page_hash=b"\x00\x01", component="v", tp=(4, REPLICATED), pp=(2, 1),
                  cache_group=7, sg=ScatterGather(3, 4, 5))
    lp = lambda b: struct.pack("<I", len(b)) + b  # noqa: E731
    want = (OBJECT_KEY_MAGIC + lp(b"kv") + lp(b"\x00\x01")
            + struct.pack("<Ii", 1, 0) + struct.pack("<Ii", 4, -1) + struct.pack("<Ii", 1, 0)
            + struct.pack("<Ii", 1, 0) + struct.pack("<Ii", 2, 1)
            + struct.pack("<I", 7) + lp(b"v") + b"\x01" + struct.pack("<IIQ", 3, 4, 5))
    assert k.encode() == want
    assert ObjectKey(pool="kv", page_hash=b"\x00\x01", component="v").encode().endswith(lp(b"v") + b"\x00")


def test_round_trip_and_determinism():
    ns = Namespace(**NS)
    assert decode_namespace(ns.encode()) == Namespace(**{**NS, "fingerprint": b"\x01\x02"})
    assert encode_namespace(**NS) == ns.encode()
    # Geometry iteration order does not change the bytes.
    rev = dict(reversed(list(NS["geometry"].items())))
    assert Namespace(**{**NS, "geometry": rev}).encode() == ns.encode()
    k = ObjectKey(**KEY, sg=ScatterGather(0, 61, 1 << 16))
    assert decode_object_key(k.encode()) == k
    assert encode_object_key(**KEY) == ObjectKey(**KEY).encode()
    # str page hashes are their UTF-8 bytes.
    assert encode_object_key(**{**KEY, "page_hash": "abc"}) == encode_object_key(**{**KEY, "page_hash": b"abc"})


def test_json_round_trip():
    ns = Namespace(**NS)
    assert Namespace.from_json(ns.to_json()).encode() == ns.encode()
    k = ObjectKey(**KEY, sg=ScatterGather(1, 2, 3))
    assert ObjectKey.from_json(k.to_json()).encode() == k.encode()


def test_key_builder_matches_object_key():
    build = key_builder(pool="kv", component="latent", tp=(8, REPLICATED), cache_group=1)
    for h in (b"\x00", b"x" * 256, "s"):
        assert build(h) == encode_object_key(pool="kv", component="latent", tp=(8, -1),
                                             cache_group=1, page_hash=h)
    with pytest.raises(ValueError):
        build(b"")
    with pytest.raises(ValueError):
        key_builder(pool="kv", component="k", tp=(2, 2))


def test_self_delimiting_fields_do_not_bleed():
    a = encode_object_key(pool="ab", page_hash=b"c", component="k")
    b = encode_object_key(pool="a", page_hash=b"bc", component="k")
    assert a != b
    a = encode_namespace(model="ab", layout="c", dtype="d", page_tokens=1)
    b = encode_namespace(model="a", layout="bc", dtype="d", page_tokens=1)
    assert a != b
    # Distinct components, replication and sg suffix give distinct keys.
    keys = {
        encode_object_key(**KEY),
        encode_object_key(**{**KEY, "component": "v"}),
        encode_object_key(**{**KEY, "tp": (4, REPLICATED)}),
        encode_object_key(**KEY, sg=ScatterGather(0, 1, 1)),
        encode_object_key(**{**KEY, "cache_group": 1}),
    }
    assert len(keys) == 5


@pytest.mark.parametrize("bad", [
    {"tp": (4, 4)},             # rank >= size
    {"tp": (4, -2)},            # rank below replicated
    {"tp": (0, 0)},             # size 0
    {"dp": (-1, 0)},            # negative size
    {"pp": (1 << 31, 0)},       # size beyond i32 ranks
    {"pool": ""},
    {"pool": "p" * 65},
    {"component": ""},
    {"component": "c" * 33},
    {"page_hash": b""},
    {"page_hash": b"h" * 257},
    {"cache_group": -1},
    {"cache_group": 1 << 32},
    {"sg": ScatterGather(0, 0, 1)},
    {"sg": ScatterGather(0, 1, 0)},
    {"sg": ScatterGather(-1, 1, 1)},
])
def test_object_key_rejects(bad):
    with pytest.raises(ValueError):
        encode_object_key(**{**KEY, **bad})


@pytest.mark.parametrize("bad", [
    {"page_tokens": 0},
    {"page_tokens": -1},
    {"page_bytes": -1},
    {"page_bytes": 1 << 64},
    {"tp": 0},
    {"dcp": -3},
    {"model": ""},
    {"model": "m" * 1025},
    {"tenant": "t" * 257},
    {"layout": ""},
    {"layout": "l" * 129},
    {"dtype": "d" * 33},
    {"fingerprint": b"f" * 65},
    {"geometry": {"Bad": 1}},
    {"geometry": {"": 1}},
    {"geometry": {"x": -1}},
    {"geometry": {f"g{i}": i for i in range(33)}},
])
def test_namespace_rejects(bad):
    with pytest.raises(ValueError):
        encode_namespace(**{**NS, **bad})


@pytest.mark.parametrize("bad", [
    {"page_tokens": 1.0}, {"page_tokens": True}, {"model": b"m"}, {"fingerprint": "x"},
    {"tp": 4.0}, {"geometry": [("a", 1)]},
])
def test_namespace_wrong_types(bad):
    with pytest.raises(TypeError):
        encode_namespace(**{**NS, **bad})


@pytest.mark.parametrize("bad", [
    {"tp": (4, True)}, {"tp": 4}, {"tp": (4, 1, 0)}, {"pool": b"kv"}, {"page_hash": 5},
    {"sg": (0, 1, 1)},
])
def test_object_key_wrong_types(bad):
    with pytest.raises(TypeError):
        encode_object_key(**{**KEY, **bad})


def test_decoders_reject_malformed():
    ns = encode_namespace(**NS)
    key = encode_object_key(**KEY, sg=ScatterGather(0, 1, 1))
    for data, dec in ((ns, decode_namespace), (key, decode_object_key)):
        with pytest.raises(ValueError):
            dec(data + b"\x00")                      # trailing byte
        for cut in (0, 7, 8, 12, len(data) - 1):
            with pytest.raises(ValueError):
                dec(data[:cut])                      # truncated
        with pytest.raises(ValueError):
            dec(b"X" + data[1:])                     # bad magic
    with pytest.raises(ValueError):
        decode_namespace(key)                        # a key is not a namespace
    # sg flag other than 0/1
    plain = encode_object_key(**KEY)
    with pytest.raises(ValueError):
        decode_object_key(plain[:-1] + b"\x02")
    # rank >= size smuggled into bytes
    bad = bytearray(plain)
    off = 8 + 4 + 2 + 4 + len(KEY["page_hash"]) + 8  # tp coordinate
    bad[off + 4: off + 8] = struct.pack("<i", 4)
    with pytest.raises(ValueError):
        decode_object_key(bytes(bad))
