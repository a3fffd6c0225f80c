#!/usr/bin/env bash
# Tests tools/test.sh's guards on scratch trees: each guard must fail on the fault it exists
# for, and pass on a clean tree. A guard that cannot fail checks nothing.
#   - tools/check-gofmt.sh: an unparseable .go file, an unformatted one
#   - tools/check-tracked.sh: a tracked executable
#   - tools/pytest_skipguard.py: a skip not in the allow-list, an entry without a reason,
#     an entry whose [ENV=value] condition does not hold
#   - testdata/golden/gen_golden.py --check: an edited object id, ring owner, tenant hash
#   - tools/gen_ctypes.py --check: an edited dfkv.h (new function, changed field type), an
#     edited generated _abi.py, a header construct outside the generator's C subset
#   - tools/build.sh: a missing command package
#   - tools/check-doclinks.py: a link to a missing file, to a missing heading; a docs/*.md too long
#   - go/e2e TestMDSExternalEtcd: no etcd binary
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails=0 n=0
# expect pass|fail "what" cmd...: runs cmd (output to a log) and checks its exit status.
expect() {
  local want=$1 what=$2; shift 2
  local log=$scratch/log got
  n=$((n + 1))
  if "$@" >"$log" 2>&1; then got=pass; else got=fail; fi
  if [ "$got" = "$want" ]; then
    if [ -n "${want_out:-}" ] && ! grep -q -- "$want_out" "$log"; then
      echo "FAIL  $what: ${got}ed but without saying '$want_out'; output:"; sed 's/^/      /' "$log" | tail -20
      fails=$((fails + 1)); return
    fi
    echo "ok    $what (${got}ed, as it should)"
  else
    echo "FAIL  $what: wanted $want, got $got; output:"; sed 's/^/      /' "$log" | tail -20
    fails=$((fails + 1))
  fi
}

# --- gofmt -------------------------------------------------------------------------------
g=$scratch/gofmt
mkdir -p "$g" && git -C "$g" init -q
printf 'package x\n\nfunc F() int { return 1 }\n' >"$g/ok.go"
git -C "$g" add ok.go
expect pass "check-gofmt: formatted tree" "$root/tools/check-gofmt.sh" "$g"
printf 'package x\n\nfunc {\n' >"$g/broken.go"
git -C "$g" add broken.go
want_out="expected" expect fail "check-gofmt: unparseable file" "$root/tools/check-gofmt.sh" "$g"
git -C "$g" rm -q -f broken.go
printf 'package x\n\nfunc G()   int { return 2 }\n' >"$g/ugly.go"
git -C "$g" add ugly.go
expect fail "check-gofmt: unformatted file" "$root/tools/check-gofmt.sh" "$g"

# --- no compiled files tracked -------------------------------------------------------------
tr=$scratch/tracked
mkdir -p "$tr" && git -C "$tr" init -q
printf 'package x\n' >"$tr/x.go"
git -C "$tr" add x.go
expect pass "check-tracked: source only" "$root/tools/check-tracked.sh" "$tr"
cp "$(type -P ls)" "$tr/server"
git -C "$tr" add server
want_out="server" expect fail "check-tracked: a tracked executable" "$root/tools/check-tracked.sh" "$tr"

# --- pytest skip allow-list --------------------------------------------------------------
p=$scratch/pytest
mkdir -p "$p/tests"
printf '[pytest]\n' >"$p/pytest.ini" # rootdir = $p, as python/ is for the real suite
printf 'def test_ok():\n    pass\n' >"$p/tests/test_ok.py"
printf '# reason\n' >"$p/allow.txt"
skipguard() { (cd "$p" && PYTHONPATH="$root/tools" "$py" -m pytest -q -p no:cacheprovider -p pytest_skipguard --skip-allowlist allow.txt tests); }
expect pass "skip guard: no skips" skipguard
printf 'import pytest\n\ndef test_s():\n    pytest.skip("no widget here")\n' >"$p/tests/test_skip.py"
want_out="NOT ALLOWED: tests/test_skip.py::test_s: no widget here" expect fail "skip guard: unlisted skip" skipguard
printf '# widgets are optional on this tree\ntests/test_skip.py: no widget\n' >"$p/allow.txt"
expect pass "skip guard: listed skip" skipguard
printf 'tests/test_skip.py: no widget\n' >"$p/allow.txt"
want_out="no '# reason'" expect fail "skip guard: entry without a reason" skipguard
printf '# only when widgets are off\n[DFKV_GUARD_TEST_WIDGETS=0] tests/test_skip.py: no widget\n' >"$p/allow.txt"
expect fail "skip guard: conditional entry, condition unmet" skipguard
expect pass "skip guard: conditional entry, condition met" env DFKV_GUARD_TEST_WIDGETS=0 bash -c "$(declare -f skipguard); p=$p root=$root py=$py; skipguard"
printf 'import pytest\n\n@pytest.mark.xfail(reason="flaky")\ndef test_x():\n    assert 0\n' >"$p/tests/test_skip.py"
expect fail "skip guard: unlisted xfail" skipguard
printf 'import pytest\npytest.skip("whole module", allow_module_level=True)\n' >"$p/tests/test_skip.py"
expect fail "skip guard: unlisted module-level skip" skipguard

# --- golden vectors ----------------------------------------------------------------------
gd=$scratch/golden
mkdir -p "$gd"
cp "$root/testdata/golden/identity.json" "$gd/identity.json"
gold() { "$py" "$root/testdata/golden/gen_golden.py" --check "$gd/identity.json"; }
expect pass "golden: checked-in vectors" gold
edit() { "$py" - "$gd/identity.json" "$1" "$2" <<'PY'
import json, sys
path, field, value = sys.argv[1:]
g = json.load(open(path))
g["vectors"][1][field] = value
open(path, "w").write(json.dumps(g, indent=2, ensure_ascii=False) + "\n")
PY
}
edit object_id 00000000000000000000000000000000
expect fail "golden: edited object id" gold
cp "$root/testdata/golden/identity.json" "$gd/identity.json"
edit ring_owner "$("$py" -c 'import json,sys; g=json.load(open(sys.argv[1])); o=g["vectors"][1]["ring_owner"]; print([n["id"] for n in g["ring"] if n["id"]!=o][0])' "$gd/identity.json")"
expect fail "golden: edited ring owner" gold
cp "$root/testdata/golden/identity.json" "$gd/identity.json"
edit ring1024_owner "$("$py" -c 'import json,sys; g=json.load(open(sys.argv[1])); o=g["vectors"][1]["ring1024_owner"]; print([n["id"] for n in g["ring"] if n["id"]!=o][0])' "$gd/identity.json")"
expect fail "golden: edited dense-ring owner" gold
cp "$root/testdata/golden/identity.json" "$gd/identity.json"
edit tenant_hash 0000000000000000
expect fail "golden: edited tenant hash" gold

# --- generated ctypes declarations (python/dfkv/_abi.py from dfkv.h) ----------------------
c=$scratch/ctypes
mkdir -p "$c"
reset_abi() { cp "$root/go/cmd/libdfkv/dfkv.h" "$c/dfkv.h"; cp "$root/python/dfkv/_abi.py" "$c/_abi.py"; }
abicheck() { "$py" "$root/tools/gen_ctypes.py" --check --header "$c/dfkv.h" --out "$c/_abi.py"; }
reset_abi
expect pass "gen_ctypes: checked-in _abi.py matches dfkv.h" abicheck
sed -i 's|^uint64_t dfkv_max_value_size(dfkv_client_t c);|&\nint dfkv_guard_new(dfkv_client_t c, const void* p, uint64_t n);|' "$c/dfkv.h"
want_out="is stale" expect fail "gen_ctypes: dfkv.h gained a function" abicheck
reset_abi
sed -i 's|^  int32_t mds_poll_ms; |  int64_t mds_poll_ms; |' "$c/dfkv.h"
want_out="c_int64" expect fail "gen_ctypes: dfkv.h changed a field type" abicheck
reset_abi
sed -i 's|"dfkv_put": (c_int, \[c_void_p, c_void_p, c_uint64|"dfkv_put": (c_int, [c_void_p, c_char_p, c_uint64|' "$c/_abi.py"
want_out="is stale" expect fail "gen_ctypes: hand-edited _abi.py" abicheck
reset_abi
sed -i 's|^  uint32_t reserved0; |  long reserved0; |' "$c/dfkv.h"
want_out="outside the supported subset" expect fail "gen_ctypes: C outside the generator's subset" abicheck

# --- build.sh ----------------------------------------------------------------------------
b=$scratch/build
mkdir -p "$b/tools" "$b/go/cmd/server" "$b/go/cmd/dfkvctl" "$b/go/cmd/bench" "$b/go/cmd/libdfkv"
cp "$root/tools/build.sh" "$b/tools/"
for c in server dfkvctl bench libdfkv; do printf 'package main\n' >"$b/go/cmd/$c/main.go"; done
want_out="go/cmd/mds is missing" expect fail "build.sh: missing command (go/cmd/mds)" env DFKV_BUILD_DIR="$b/out" "$b/tools/build.sh"

# --- doc links ---------------------------------------------------------------------------
dl=$scratch/doclinks
mkdir -p "$dl/docs/sub"
printf '# Guide\n[a](docs/A.md) [b](docs/A.md#two--three) ![p](docs/sub/p.svg) [w](https://x.invalid/y)\n' >"$dl/README.md"
printf '# One\n## Two — three\n[up](../README.md#guide)\n```\n[not a link](nowhere.md)\n```\n' >"$dl/docs/A.md"
printf '<svg/>\n' >"$dl/docs/sub/p.svg"
doclinks() { "$py" "$root/tools/check-doclinks.py" "$dl"; }
expect pass "check-doclinks: links resolve" doclinks
printf '[gone](sub/missing.md)\n' >>"$dl/docs/A.md"
want_out="sub/missing.md: no such file" expect fail "check-doclinks: link to a missing file" doclinks
printf '# One\n[bad](../README.md#nope)\n' >"$dl/docs/A.md"
want_out="no heading #nope" expect fail "check-doclinks: link to a missing heading" doclinks
printf '# One\n' >"$dl/docs/A.md"
seq 401 >>"$dl/docs/A.md"
want_out="over 400" expect fail "check-doclinks: a docs/*.md over 400 lines" doclinks

# --- external etcd ------------------------------------------------------------------------
# Without an etcd the MDS end-to-end test must fail, not skip (DFKV_ETCD names the binary).
want_out="external etcd not on PATH" expect fail "e2e: no etcd fails TestMDSExternalEtcd" \
  env -C "$root" DFKV_ETCD=/nonexistent/etcd DFKV_BIN_DIR=/nonexistent go test -count=1 -run '^TestMDSExternalEtcd$' ./go/e2e

echo "test-guards: $((n - fails))/$n passed"
[ $fails = 0 ]
