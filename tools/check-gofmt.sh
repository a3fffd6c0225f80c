#!/usr/bin/env bash
# Fails when gofmt would change a tracked Go file, or cannot parse one (gofmt exits 2 on a
# syntax error; that must fail the check, not vanish). Generated FlatBuffers code is flatc's.
#   tools/check-gofmt.sh [tree]   (default: the repository root; tree must be a git work tree)
set -euo pipefail
tree=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$tree"
mapfile -t files < <(git ls-files '*.go' | grep -v '_generated\.go$' || true)
[ ${#files[@]} -gt 0 ] || { echo "check-gofmt: no Go files tracked in $tree"; exit 1; }
if ! out=$(gofmt -l "${files[@]}" 2>&1); then
  echo "check-gofmt: gofmt failed:"; echo "$out"; exit 1
fi
if [ -n "$out" ]; then echo "check-gofmt: gofmt would change:"; echo "$out"; exit 1; fi
echo "check-gofmt: ${#files[@]} files formatted"
