#!/usr/bin/env bash
# The platform wheel installs with pip into a fresh virtualenv (offline: --no-index) and
# `import dfkv` loads the libdfkv.so bundled in it, with no DFKV_LIB and no build tree.
#   wheel_install_test.sh WHEEL [PYTHON]
set -euo pipefail
whl=$(readlink -f "$1"); py=${2:-python3}
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/dfkv-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-deps --disable-pip-version-check "$whl"
cd "$tmp"
env -u DFKV_LIB "$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import sys
import dfkv
from dfkv import _lib
c = dfkv.Client(members="n1=127.0.0.1:1", namespace=b"wheel-test")
path = _lib.loaded_path()
c.close()
assert path and path.startswith(sys.argv[1]), "loaded %r, not the wheel's copy" % path
# the wheel's dfkv-lmcache.pth ran at start-up and points LMCache's adapter scan at this dfkv
assert "_dfkv_lmcache_hook" in sys.modules, "dfkv-lmcache.pth did not run"
import _dfkv_lmcache_hook
d = _dfkv_lmcache_hook.discovery_dir()
assert d and d.startswith(sys.argv[1]), "LMCache discovery dir %r, not the wheel's" % d
print("OK: dfkv", dfkv.__version__ if hasattr(dfkv, "__version__") else "", "loaded", path)
PY
