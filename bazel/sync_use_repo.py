#!/usr/bin/env python3
"""Keeps MODULE.bazel's `use_repo(go_deps, ...)` equal to the Go repositories that BUILD
files reference (gazelle writes deps like "@io_etcd_go_etcd_client_v3//:client"; bzlmod
only lets a BUILD file see repositories listed in use_repo). The stdlib stand-in for
`bazel mod tidy`, which needs buildozer (not available offline).

  sync_use_repo.py [--fix] [WORKSPACE]   exit 1 (check) when the list is stale
"""
import os
import re
import sys

NOT_GO = {"rules_go", "io_bazel_rules_go", "gazelle", "bazel_gazelle", "rules_cc", "rules_shell",
          "bazel_tools", "platforms", "flatbuffers_src", "bazel_skylib", "rules_python"}
REF = re.compile(r'"@([A-Za-z0-9_.~+-]+)//')
BLOCK = re.compile(r"use_repo\(\s*go_deps\s*,(.*?)\)", re.S)


def referenced(ws):
    repos = set()
    for dirpath, dirnames, filenames in os.walk(ws):
        rel = os.path.relpath(dirpath, ws)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if not d.startswith(("bazel-", ".")) and d != "build"]
        for f in filenames:
            if f in ("BUILD.bazel", "BUILD"):
                for m in REF.finditer(open(os.path.join(dirpath, f)).read()):
                    repos.add(m.group(1))
    return sorted(r for r in repos if r not in NOT_GO)


def main():
    args = [a for a in sys.argv[1:] if a != "--fix"]
    fix = "--fix" in sys.argv[1:]
    ws = args[0] if args else os.getcwd()
    path = os.path.join(ws, "MODULE.bazel")
    text = open(path).read()
    m = BLOCK.search(text)
    if not m:
        sys.exit("sync_use_repo.py: no use_repo(go_deps, ...) in MODULE.bazel")
    have = sorted(re.findall(r'"([^"]+)"', m.group(1)))
    want = referenced(ws)
    if have == want:
        print("MODULE.bazel use_repo(go_deps) is current (%d repositories)" % len(want))
        return
    if not fix:
        print("MODULE.bazel use_repo(go_deps) is stale:")
        for r in sorted(set(want) - set(have)):
            print("  missing  " + r)
        for r in sorted(set(have) - set(want)):
            print("  unused   " + r)
        sys.exit(1)
    body = "use_repo(\n    go_deps,\n" + "".join('    "%s",\n' % r for r in want) + ")"
    open(path, "w").write(text[:m.start()] + body + text[m.end():])
    print("MODULE.bazel: use_repo(go_deps) now lists %d repositories" % len(want))


if __name__ == "__main__":
    main()
