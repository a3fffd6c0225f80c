#!/usr/bin/env python3
"""Writes the dfkv release tarball: reproducible (fixed mtime/owner/order), with SHA256SUMS.

  release.py --out dfkv.tar.gz --prefix dfkv-0.1.0-linux-x86_64 DEST=SRC ...

DEST is the path inside the top directory (DEST ending in "/" keeps SRC's basename).
SHA256SUMS (sha256sum -c format, relative to the top directory) is added last.
"""
import argparse
import gzip
import hashlib
import io
import os
import tarfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("entries", nargs="+")
    a = ap.parse_args()
    files = {}
    for e in a.entries:
        dest, src = e.split("=", 1)
        if dest.endswith("/"):
            dest += os.path.basename(src)
        if dest in files:
            raise SystemExit("release.py: %s listed twice" % dest)
        files[dest] = src

    def info(name, size, mode):
        ti = tarfile.TarInfo(a.prefix + "/" + name)
        ti.size, ti.mode, ti.mtime = size, mode, 0
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        return ti

    sums = []
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs = sorted({os.path.dirname(d) for d in files if os.path.dirname(d)})
        for d in [""] + dirs:
            ti = tarfile.TarInfo(a.prefix + ("/" + d if d else ""))
            ti.type, ti.mode, ti.mtime, ti.uname, ti.gname = tarfile.DIRTYPE, 0o755, 0, "root", "root"
            tar.addfile(ti)
        for dest in sorted(files):
            data = open(files[dest], "rb").read()
            exe = os.access(files[dest], os.X_OK) and (data[:4] == b"\x7fELF" or data[:2] == b"#!")
            tar.addfile(info(dest, len(data), 0o755 if exe else 0o644), io.BytesIO(data))
            sums.append("%s  %s\n" % (hashlib.sha256(data).hexdigest(), dest))
        body = "".join(sums).encode()
        tar.addfile(info("SHA256SUMS", len(body), 0o644), io.BytesIO(body))
    with open(a.out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
            gz.write(raw.getvalue())


if __name__ == "__main__":
    main()
