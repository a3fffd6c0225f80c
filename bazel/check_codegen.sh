#!/usr/bin/env bash
# Compares (check) or installs (update) the FlatBuffers code generated in the graph
# (//schema:fb_gen) against/over the checked-in go/internal/wire/fb and python/dfkv/_fb.
#   check GEN... -- CHECKED_IN...    (sh_test //schema:codegen_test)
#   update GEN...                    (bazel run //schema:update)
set -euo pipefail
mode=$1; shift
gen=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do gen+=("$1"); shift; done
[ $# -gt 0 ] && shift
dest_of() {  # generated path -> checked-in path relative to the repository root
  case "$1" in
    */go/*.go) echo "go/internal/wire/fb/$(basename "$1")" ;;
    */py/*.py) echo "python/dfkv/_fb/$(basename "$1")" ;;
    *) echo "check_codegen.sh: unexpected generated file $1" >&2; exit 2 ;;
  esac
}
if [ "$mode" = update ]; then
  ws=${BUILD_WORKSPACE_DIRECTORY:?run me with bazel run}
  find "$ws/go/internal/wire/fb" -name '*_generated.go' -delete
  find "$ws/python/dfkv/_fb" -name '*_generated.py' -delete
  for g in "${gen[@]}"; do d=$ws/$(dest_of "$g"); cp "$g" "$d"; chmod 644 "$d"; done
  echo "//schema:update: wrote ${#gen[@]} files into go/internal/wire/fb and python/dfkv/_fb"
  exit 0
fi
declare -A want=()
rc=0
for g in "${gen[@]}"; do want[$(dest_of "$g")]=$g; done
for c in "$@"; do
  if [ -z "${want[$c]:-}" ]; then echo "extra checked-in file (no schema generates it): $c"; rc=1; fi
done
for d in "${!want[@]}"; do
  if [ ! -f "$d" ]; then echo "missing checked-in file: $d"; rc=1; continue; fi
  diff -u "$d" "${want[$d]}" || rc=1
done
if [ $rc -ne 0 ]; then
  echo "FAIL: checked-in FlatBuffers code is stale; run tools/gen.sh (or tools/bazel run //schema:update)"
  exit 1
fi
echo "OK: ${#gen[@]} generated files match the checked-in code"
