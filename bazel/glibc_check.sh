#!/usr/bin/env bash
# sh_test wrapper: python3 glibc_check.py ARGS (objdump from binutils must be on PATH).
set -euo pipefail
command -v objdump >/dev/null || { echo "objdump (binutils) is required"; exit 1; }
exec python3 "$@"
