#!/usr/bin/env python3
"""Fails when an ELF file in the release tarball (or in a wheel inside it) needs a glibc
symbol version above the limit (default 2.35: Ubuntu 22.04). Reads the version needs with
`objdump -T` (binutils).

  glibc_check.py [--max 2.35] RELEASE.tar.gz
"""
import argparse
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile

VER = re.compile(r"\bGLIBC_(\d+)\.(\d+)(?:\.(\d+))?\b")


def needs(path):
    """{(major, minor, patch): [symbols]} from objdump -T; None for a static executable."""
    r = subprocess.run(["objdump", "-T", path], capture_output=True, text=True)
    if r.returncode != 0:
        if "not a dynamic object" in r.stderr or "no symbols" in r.stderr:
            return None
        raise SystemExit("objdump -T %s failed: %s" % (path, r.stderr))
    out = {}
    for line in r.stdout.splitlines():
        m = VER.search(line)
        if m:
            v = tuple(int(x or 0) for x in m.groups())
            out.setdefault(v, []).append(line.split()[-1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="2.35")
    ap.add_argument("tarball")
    a = ap.parse_args()
    limit = tuple(int(x) for x in a.max.split(".")) + (0,)
    limit = limit[:3]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    elves = []  # (display name, path on disk)

    def consider(name, data):
        if data[:4] == b"\x7fELF":
            p = os.path.join(tmp, "%d_%s" % (len(elves), os.path.basename(name)))
            with open(p, "wb") as f:
                f.write(data)
            elves.append((name, p))
        elif name.endswith(".whl"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for n in z.namelist():
                    consider(name + "!" + n, z.read(n))

    with tarfile.open(a.tarball) as t:
        for m in t.getmembers():
            if m.isfile():
                consider(m.name, t.extractfile(m).read())
    if not elves:
        raise SystemExit("no ELF files found in %s" % a.tarball)
    bad = 0
    for name, path in elves:
        n = needs(path)
        if n is None:
            print("ok   %-60s static (no glibc needs)" % name)
            continue
        if not n:
            print("ok   %-60s dynamic, no GLIBC_ versions" % name)
            continue
        top = max(n)
        over = {v: s for v, s in n.items() if v > limit}
        fmt = lambda v: "GLIBC_" + ".".join(str(x) for x in (v if v[2] else v[:2]))
        if over:
            bad += 1
            print("FAIL %-60s needs %s > GLIBC_%s:" % (name, fmt(top), a.max))
            for v in sorted(over):
                print("       %s: %s" % (fmt(v), ", ".join(sorted(set(over[v])))))
        else:
            print("ok   %-60s max %s (%d versioned symbols)" % (name, fmt(top), sum(len(s) for s in n.values())))
    if bad:
        print("%d ELF file(s) need glibc symbols newer than %s" % (bad, a.max))
        sys.exit(1)
    print("all %d ELF files need at most GLIBC_%s" % (len(elves), a.max))


if __name__ == "__main__":
    main()
