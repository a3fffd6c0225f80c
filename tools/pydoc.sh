#!/usr/bin/env bash
# Renders the Python API reference (dfkv, from its docstrings) with pdoc into build/pydoc/
# (open build/pydoc/index.html). Fails when a module does not import or pdoc warns (a broken
# cross-reference, say). The engine connectors (dfkv.connectors.*, documented in
# docs/CONNECTORS.md) are left out: importing them needs torch and the engines.
#
#   tools/pydoc.sh [OUT_DIR]      (installs pdoc with pip when missing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
out=${1:-$root/build/pydoc}
if ! "$py" -c 'import pdoc' 2>/dev/null; then
  echo "installing pdoc with pip (the API reference renderer)"
  "$py" -m pip install -q --disable-pip-version-check pdoc
fi
rm -rf "$out"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Warnings are errors: pdoc reports import failures and bad references as warnings.
if ! PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -W error -m pdoc --docformat markdown \
    -o "$out" dfkv dfkv.client dfkv.topology '!dfkv.connectors' >"$log" 2>&1 || grep -qi "warn" "$log"; then
  cat "$log"; echo "tools/pydoc.sh: pdoc failed"; exit 1
fi
for page in dfkv.html dfkv/client.html dfkv/errors.html dfkv/topology.html; do
  [ -s "$out/$page" ] || { echo "tools/pydoc.sh: $out/$page was not rendered"; exit 1; }
done
echo "tools/pydoc.sh: API reference in $out/index.html"
