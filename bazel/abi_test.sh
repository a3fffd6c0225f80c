#!/usr/bin/env bash
# sh_test //go/cmd/libdfkv:abi_c_test: the C ABI test program (testdata/abi_test.c, built
# by Bazel against the checked-in dfkv.h and the Bazel-built libdfkv.so) against a real
# dfkv_server. The Bazel form of TestCProgram, which shells out to `go build` and gcc.
#   abi_test.sh ABI_TEST_BINARY DFKV_SERVER
set -euo pipefail
prog=$PWD/$1 server=$PWD/$2
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/abi.XXXXXX")
"$server" --host 127.0.0.1 --port 0 --addr-file "$tmp/addr" --dir "$tmp/data" --cap 256MiB --max-msg 32MiB --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 750); do [ -s "$tmp/addr" ] && break; sleep 0.02; done
[ -s "$tmp/addr" ] || { echo "dfkv_server did not write its address"; exit 1; }
out=$(DFKV_TEST_ADDR=$(cat "$tmp/addr") "$prog" 2>&1) || { echo "$out"; echo "C ABI test program failed"; exit 1; }
echo "$out"
last=$(echo "$out" | tail -1)
case "$last" in
  "0 passed"*) echo "no checks ran"; exit 1 ;;
  *" 0 failed") ;;
  *) echo "unexpected summary: $last"; exit 1 ;;
esac
