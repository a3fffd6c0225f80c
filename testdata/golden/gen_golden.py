#!/usr/bin/env python3
"""Independent generator of the identity/placement golden vectors in identity.json.

The vectors' outputs must come from outside the code they test, so this script computes them
from the contract alone (SPEC §2-3 and docs/ARCHITECTURE.md), with nothing but hashlib. It
imports neither go/ nor the dfkv Python package. The contract:

  object id    = SHA-256( u64le(len ns) ns u64le(len key) key )[0:16], printed as 32 hex digits;
                 hi = bytes 0..7 and lo = bytes 8..15, each read big-endian.
  tenant hash  = SHA-256( "DFKVTENANT1" u64le(len t) t )[0:8], printed as 16 hex digits.
  ring(P)      = weighted Ketama with P points per weight: a node of weight w gets P*w/4
                 SHA-256 digests of utf8(id) "#" decimal(d), d = 0..P*w/4-1; each digest
                 is four u64le points.
                 Points sort by (point, node index), nodes indexed in id byte order.
                 owner(h) = node of the first point >= h, wrapping to the first point.
  ring_owner   = owner(hi) over "ring" with P = 160 (the first releases' placement ring,
                 still selectable), ring1024_owner = owner(hi) over "ring" with P = 1024
                 (the default placement ring); disk_owner = owner(lo) over "disks", P = 160.

Inputs (namespace_hex, key_hex, tenant_hex, ring, disks, and the Python codec's "structured"
records) are hand-written; outputs are recomputed here.

  gen_golden.py --check [file]   exit 1 (and print the differences) if any output differs
  gen_golden.py --write [file]   rewrite the outputs (only for a new vector: published
                                 outputs must never change)
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUTS = ("object_id", "tenant_hash", "ring_owner", "ring1024_owner", "disk_owner")


def u64le(n: int) -> bytes:
    return n.to_bytes(8, "little")


def object_id(ns: bytes, key: bytes) -> bytes:
    return hashlib.sha256(u64le(len(ns)) + ns + u64le(len(key)) + key).digest()[:16]


def tenant_hash(t: bytes) -> bytes:
    return hashlib.sha256(b"DFKVTENANT1" + u64le(len(t)) + t).digest()[:8]


class Ketama:
    def __init__(self, nodes, points_per_weight=160):
        ids = sorted((n["id"] for n in nodes), key=lambda s: s.encode("utf-8"))
        weight = {n["id"]: n["weight"] for n in nodes}
        pts = []
        for idx, nid in enumerate(ids):
            for d in range(points_per_weight // 4 * weight[nid]):
                dig = hashlib.sha256(nid.encode("utf-8") + b"#" + str(d).encode("ascii")).digest()
                for k in range(4):
                    pts.append((int.from_bytes(dig[8 * k:8 * k + 8], "little"), idx))
        pts.sort()
        self.hashes = [p[0] for p in pts]
        self.owner_idx = [p[1] for p in pts]
        self.ids = ids

    def owner(self, h: int) -> str:
        i = bisect.bisect_left(self.hashes, h)
        if i == len(self.hashes):
            i = 0
        return self.ids[self.owner_idx[i]]


def compute(g: dict) -> dict:
    ring, disks = Ketama(g["ring"]), Ketama(g["disks"])
    ring1024 = Ketama(g["ring"], 1024)
    out = json.loads(json.dumps(g))  # deep copy, same key order
    for v in out["vectors"]:
        oid = object_id(bytes.fromhex(v["namespace_hex"]), bytes.fromhex(v["key_hex"]))
        v["object_id"] = oid.hex()
        v["tenant_hash"] = tenant_hash(bytes.fromhex(v["tenant_hex"])).hex()
        v["ring_owner"] = ring.owner(int.from_bytes(oid[:8], "big"))
        v["ring1024_owner"] = ring1024.owner(int.from_bytes(oid[:8], "big"))
        v["disk_owner"] = disks.owner(int.from_bytes(oid[8:], "big"))
    return out


def main(argv) -> int:
    if len(argv) < 2 or argv[1] not in ("--check", "--write"):
        print("usage: gen_golden.py --check|--write [identity.json]", file=sys.stderr)
        return 2
    path = argv[2] if len(argv) > 2 else os.path.join(HERE, "identity.json")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    g = json.loads(text)
    want = compute(g)
    if argv[1] == "--write":
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(want, indent=2, ensure_ascii=False) + "\n")
        return 0
    bad = 0
    for have, exp in zip(g["vectors"], want["vectors"]):
        for k in OUTPUTS:
            if have.get(k) != exp[k]:
                print(f"{path}: vector {have.get('name')!r}: {k} is {have.get(k)!r}, the contract gives {exp[k]!r}")
                bad += 1
    if len(g["vectors"]) < 8:
        print(f"{path}: only {len(g['vectors'])} vectors")
        bad += 1
    if not bad and json.dumps(want, indent=2, ensure_ascii=False) + "\n" != text:
        print(f"{path}: outputs agree but the file is not in canonical form (run --write)")
        bad += 1
    if bad:
        return 1
    print(f"gen_golden: {len(g['vectors'])} vectors in {path} agree with the independent implementation")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
