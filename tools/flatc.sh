#!/usr/bin/env bash
# Prints the path of a flatc whose version matches the pinned FlatBuffers Go runtime in
# go.mod, building it once from the C++ sources inside that module's zip. The build lands
# in a cache directory outside the repo ($DFKV_CACHE, default ~/.cache/dfkv) and is
# reused; an interrupted build leaves no half-installed binary behind.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ver=$(cd "$root" && go list -m -f '{{.Version}}' github.com/google/flatbuffers)
plain=${ver#v}; plain=${plain%%+*}
cache=${DFKV_CACHE:-$HOME/.cache/dfkv}
out=$cache/flatc-$plain/flatc
if [ -x "$out" ] && "$out" --version 2>/dev/null | grep -q "$plain"; then
  echo "$out"; exit 0
fi
src=$(cd "$root" && go mod download -json "github.com/google/flatbuffers@$ver" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
[ -d "$src" ] || { echo "flatc.sh: cannot locate flatbuffers $ver sources" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/dfkv-flatc.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "flatc.sh: building flatc $plain from $src (one time, ~3 min)" >&2
cp -r "$src" "$work/src"; chmod -R u+w "$work/src"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$work/src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DFLATBUFFERS_BUILD_TESTS=OFF -DFLATBUFFERS_BUILD_FLATLIB=OFF -DFLATBUFFERS_BUILD_FLATHASH=OFF \
  -DFLATBUFFERS_BUILD_FLATC=ON >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target flatc -j"$(nproc)" >"$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$work/build/flatc" "$out.tmp.$$" && mv -f "$out.tmp.$$" "$out"
"$out" --version >&2
echo "$out"
