#!/usr/bin/env bash
# Fails when git tracks a compiled artifact (an ELF executable, shared object or object
# file): build outputs belong in build/, never in the repository. Two binaries once landed
# at the root from a `go build` run there.
#   tools/check-tracked.sh [tree]   (default: the repository root; tree must be a git work tree)
set -euo pipefail
tree=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$tree"
git ls-files -z | python3 -c '
import sys
bad = []
for p in sys.stdin.buffer.read().split(b"\0"):
    if not p:
        continue
    try:
        with open(p, "rb") as f:
            if f.read(4) == b"\x7fELF":
                bad.append(p.decode(errors="replace"))
    except (FileNotFoundError, IsADirectoryError):
        pass
if bad:
    print("check-tracked: compiled ELF files are tracked (git rm --cached them; build into build/):")
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
print("check-tracked: no compiled files tracked")
'
