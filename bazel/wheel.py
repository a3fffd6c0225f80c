#!/usr/bin/env python3
"""Builds a dfkv wheel from python/ without network or build backends (stdlib only).

  wheel.py --out OUT.whl --pyproject python/pyproject.toml --readme python/README.md \
           --version-file python/dfkv/_version.py [--lib libdfkv.so --header dfkv.h \
           --platform manylinux_2_35_x86_64] -- python/dfkv/...files

Without --lib: a pure wheel (py3-none-any) that finds libdfkv.so via $DFKV_LIB or a build
tree. With --lib: a platform wheel carrying dfkv/lib/libdfkv.so (+ dfkv.h), which
dfkv._lib finds first after $DFKV_LIB, so `pip install` just works. The output is
byte-for-byte reproducible (fixed timestamps and order).
"""
import argparse
import base64
import hashlib
import re
import sys
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

EPOCH = (1980, 1, 1, 0, 0, 0)

# Files at the root of the wheel (site-packages), beside the dfkv package: the start-up hook
# that lets LMCache's adapter discovery find dfkv:// remote URLs and the .pth that runs it
# (python/setup.py ships the same two in setuptools-built wheels).
ROOT_FILES = ("_dfkv_lmcache_hook.py", "dfkv-lmcache.pth")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pyproject", required=True)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--version-file", required=True)
    ap.add_argument("--lib")
    ap.add_argument("--header")
    ap.add_argument("--platform", default="manylinux_2_35_x86_64")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()

    version = re.search(r'__version__\s*=\s*"([^"]+)"', open(a.version_file).read()).group(1)
    meta = {}
    if tomllib:
        with open(a.pyproject, "rb") as f:
            meta = tomllib.load(f)["project"]
    name = meta.get("name", "dfkv")
    tag = "py3-none-" + a.platform if a.lib else "py3-none-any"
    dist = "%s-%s" % (name, version)

    files = {}  # archive name -> bytes
    for path in sorted(a.files):
        i = path.rfind("python/dfkv/")
        root = [f for f in ROOT_FILES if path == "python/" + f or path.endswith("/python/" + f)]
        if root:
            arc = root[0]
        elif i < 0:
            sys.exit("wheel.py: %s is neither under python/dfkv/ nor one of %s" % (path, ROOT_FILES))
        else:
            arc = path[i + len("python/"):]
        if "__pycache__" in arc or arc.endswith(".pyc"):
            continue
        files[arc] = open(path, "rb").read()
    if a.lib:
        files["dfkv/lib/libdfkv.so"] = open(a.lib, "rb").read()
        if a.header:
            files["dfkv/lib/dfkv.h"] = open(a.header, "rb").read()

    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version]
    if meta.get("description"):
        lines.append("Summary: " + meta["description"])
    if meta.get("requires-python"):
        lines.append("Requires-Python: " + meta["requires-python"])
    for c in meta.get("classifiers", []):
        lines.append("Classifier: " + c)
    for dep in meta.get("dependencies", []):
        lines.append("Requires-Dist: " + dep)
    for extra, deps in sorted(meta.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: " + extra)
        for dep in deps:
            lines.append('Requires-Dist: %s ; extra == "%s"' % (dep, extra))
    lines.append("Description-Content-Type: text/markdown")
    metadata = "\n".join(lines) + "\n\n" + open(a.readme).read()
    wheel = "Wheel-Version: 1.0\nGenerator: dfkv-bazel (bazel/wheel.py)\nRoot-Is-Purelib: %s\nTag: %s\n" % (
        "false" if a.lib else "true", tag)
    files[dist + ".dist-info/METADATA"] = metadata.encode()
    files[dist + ".dist-info/WHEEL"] = wheel.encode()
    tops = ["dfkv"] + [f[:-3] for f in ROOT_FILES if f.endswith(".py") and f in files]
    files[dist + ".dist-info/top_level.txt"] = ("\n".join(tops) + "\n").encode()

    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
    record.append(dist + ".dist-info/RECORD,,")
    files[dist + ".dist-info/RECORD"] = ("\n".join(record) + "\n").encode()

    with zipfile.ZipFile(a.out, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            zi = zipfile.ZipInfo(arc, EPOCH)
            zi.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)


if __name__ == "__main__":
    main()
