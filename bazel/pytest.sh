#!/usr/bin/env bash
# sh_test //python:pytest: the Python suite against the Bazel-built libdfkv.so and
# dfkv_server. Runs from the runfiles tree (cwd), with absolute DFKV_LIB / DFKV_SERVER.
set -euo pipefail
# Real paths (not runfiles symlinks): the tests compare the library path with /proc/self/maps.
for f in $DFKV_LIBS; do case $f in *.so) DFKV_LIB=$(readlink -f "$f") ;; esac; done
DFKV_SERVER=$(readlink -f "$DFKV_SERVER")
export DFKV_LIB DFKV_SERVER PYTHONDONTWRITEBYTECODE=1
[ -f "$DFKV_LIB" ] && [ -x "$DFKV_SERVER" ] || { echo "pytest.sh: missing $DFKV_LIB or $DFKV_SERVER"; exit 1; }
python3 -c 'import pytest, numpy, flatbuffers' || { echo "pytest.sh: python3 needs pytest, numpy and flatbuffers"; exit 1; }
cd python
exec python3 -m pytest -q -p no:cacheprovider ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} tests
