#!/usr/bin/env bash
# bazel/version.bzl's DFKV_VERSION must equal VERSION and python/dfkv/_version.py.
set -euo pipefail
want=$1
got_file=$(tr -d ' \n' < "$2")
got_py=$(sed -n 's/^__version__ *= *"\(.*\)"/\1/p' "$3")
if [ "$want" != "$got_file" ] || [ "$want" != "$got_py" ]; then
  echo "version mismatch: bazel/version.bzl=$want VERSION=$got_file python/dfkv/_version.py=$got_py"
  exit 1
fi
echo "OK: version $want"
