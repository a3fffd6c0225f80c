#!/usr/bin/env python3
"""Fails when a relative link in README.md or docs/ does not resolve, or a docs/*.md is too long.

  tools/check-doclinks.py [ROOT]

Checks every Markdown link and image ([t](path), ![t](path), <img src="path">) outside code
blocks in README.md, python/README.md and docs/**/*.md: the file or directory must exist, and
an anchor (path.md#section, #section) must name a heading of the target, slugged as GitHub
does. Web links are not fetched. docs/*.md (the top-level guides; docs/BENCHMARKS.md is
generated) may not exceed MAX_LINES: one job per file, short enough to read.
"""
from __future__ import annotations

import os
import re
import sys

MAX_LINES = 400
GENERATED = {"docs/BENCHMARKS.md"}
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def strip_code(text: str) -> list[str]:
    """The file's lines with fenced blocks blanked and inline code spans removed."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    h = h.replace("`", "").lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path: str, cache: dict) -> set:
    if path not in cache:
        seen: dict = {}
        for line in strip_code(open(path, encoding="utf-8").read()):
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            seen.setdefault(s if n == 0 else f"{s}-{n}", 1)
        cache[path] = set(seen)
    return cache[path]


def md_files(root: str) -> list[str]:
    files = [f for f in ("README.md", "python/README.md") if os.path.exists(os.path.join(root, f))]
    for d, _, names in os.walk(os.path.join(root, "docs")):
        files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".md")]
    return sorted(files)


def main() -> int:
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad: list[str] = []
    cache: dict = {}
    files = md_files(root)
    for rel in files:
        path = os.path.join(root, rel)
        text = open(path, encoding="utf-8").read()
        if os.path.dirname(rel) == "docs" and rel not in GENERATED:
            n = text.count("\n")
            if n > MAX_LINES:
                bad.append(f"{rel}: {n} lines, over {MAX_LINES}: split it or cut it")
        for i, line in enumerate(strip_code(text), 1):
            for target in LINK.findall(line) + IMG.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                    continue
                dest, _, frag = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(path), dest)) if dest else path
                if not full.startswith(root + os.sep) and full != root:
                    bad.append(f"{rel}:{i}: {target} leaves the repository")
                elif not os.path.exists(full):
                    bad.append(f"{rel}:{i}: {target}: no such file")
                elif frag and full.endswith(".md") and frag.lower() not in anchors(full, cache):
                    bad.append(f"{rel}:{i}: {target}: no heading #{frag} in {os.path.relpath(full, root)}")
    for b in bad:
        print("check-doclinks:", b, file=sys.stderr)
    if bad:
        return 1
    print(f"check-doclinks: {len(files)} files, links resolve, docs/*.md within {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
