#!/usr/bin/env bash
# Regenerates the checked-in FlatBuffers code from schema/*.fbs with the pinned flatc.
#   tools/gen.sh           rewrite go/internal/wire/fb and python/dfkv/_fb
#   tools/gen.sh --check   fail (exit 1, with a diff) when the checked-in code is stale
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flatc=$("$root/tools/flatc.sh")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dfkv-gen.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
schemas=("$root"/schema/*.fbs)
"$flatc" --go --go-namespace fb --gen-onefile -o "$tmp/go" "${schemas[@]}"
"$flatc" --python --gen-onefile -o "$tmp/py" "${schemas[@]}"
gofmt -w "$tmp/go"
cat > "$tmp/py/__init__.py" <<'PY'
"""FlatBuffers code generated from schema/*.fbs by tools/gen.sh. Do not edit."""
PY
go_dst=$root/go/internal/wire/fb
py_dst=$root/python/dfkv/_fb
if [ "${1:-}" = "--check" ]; then
  rc=0
  diff -ru --exclude=doc.go --exclude=fb_test.go --exclude=BUILD.bazel "$tmp/go" "$go_dst" || rc=1
  diff -ru --exclude=__pycache__ --exclude=BUILD.bazel "$tmp/py" "$py_dst" || rc=1
  if [ $rc -ne 0 ]; then
    echo "gen.sh: checked-in FlatBuffers code is stale; run tools/gen.sh" >&2
    exit 1
  fi
  echo "gen.sh: generated code is up to date ($("$flatc" --version))"
  exit 0
fi
mkdir -p "$go_dst" "$py_dst"
find "$go_dst" -name '*_generated.go' -delete
find "$py_dst" -name '*_generated.py' -delete
cp "$tmp"/go/*.go "$go_dst/"
cp "$tmp"/py/*.py "$py_dst/"
echo "gen.sh: wrote $go_dst and $py_dst"
