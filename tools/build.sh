#!/usr/bin/env bash
# Builds every dfkv artifact of the plain-Go route into build/:
#   dfkv_server dfkvctl dfkv_bench dfkv_mds libdfkv.so dfkv.h
# Usage: tools/build.sh [--race]   (--race builds the binaries with the race detector)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${DFKV_BUILD_DIR:-$root/build}
mkdir -p "$out"
# The ibverbs RDMA provider is cgo over its own declarations of the verbs ABI (no rdma-core
# headers needed); the library is dlopen'ed at run time, so the binaries run where rdma-core
# is absent.
ver=$(cat VERSION 2>/dev/null || echo 0.1.0-dev)
ld="-X github.com/dfkv/dfkv/go/internal/version.Version=$ver"
race=()
[ "${1:-}" = "--race" ] && race=(-race)
for cmd in server:dfkv_server dfkvctl:dfkvctl bench:dfkv_bench mds:dfkv_mds libdfkv:; do
  # Every command must be there: a missing one fails the build rather than vanishing.
  pkg=${cmd%%:*}
  if ! compgen -G "go/cmd/$pkg/*.go" >/dev/null; then
    echo "tools/build.sh: go/cmd/$pkg is missing (no Go files in $root/go/cmd/$pkg)" >&2
    exit 1
  fi
done
for cmd in server:dfkv_server dfkvctl:dfkvctl bench:dfkv_bench mds:dfkv_mds; do
  pkg=${cmd%%:*} bin=${cmd##*:}
  go build "${race[@]}" -trimpath -ldflags "$ld" -o "$out/$bin" "./go/cmd/$pkg"
done
# The version script keeps every symbol but the dfkv_* ABI local to the library.
go build -trimpath -buildmode=c-shared \
  -ldflags "$ld -extldflags=-Wl,--version-script=$root/go/cmd/libdfkv/exports.map" \
  -o "$out/libdfkv.so" ./go/cmd/libdfkv
rm -f "$out/libdfkv.h"            # cgo's generated header; dfkv.h is the contract
cp go/cmd/libdfkv/dfkv.h "$out/dfkv.h"
echo "tools/build.sh: built $(cd "$out" && ls | tr '\n' ' ')in $out"
