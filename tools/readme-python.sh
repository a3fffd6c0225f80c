#!/usr/bin/env bash
# The README's Python example, run the way a new user runs it: a fresh virtualenv outside the
# checkout, `pip install ./python` (which builds libdfkv.so with Go into the package), a real
# build/dfkv_server on loopback, then the example block extracted from README.md (between
# `<!-- python-example` and `<!-- end python-example -->`) run from a directory outside the
# checkout, with no DFKV_LIB or PYTHONPATH. Fails if the install, the library lookup or the
# example fails. Also checks that the install without Go fails with the one-line message that
# names the wheel route.
#
#   tools/readme-python.sh        (after tools/build.sh; PYTHON=python3.x to pick the interpreter)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
server=${DFKV_SERVER:-$root/build/dfkv_server}
[ -x "$server" ] || { echo "tools/readme-python.sh: $server is not built (run tools/build.sh)"; exit 1; }
work=$(mktemp -d)
spid=
cleanup() {
  if [ -n "$spid" ]; then kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
clean_env=(env -u DFKV_LIB -u DFKV_SERVER -u DFKV_BIN_DIR -u PYTHONPATH)

"$py" -m venv "$work/venv"
vpy=$work/venv/bin/python
pipq=(-m pip install -q --disable-pip-version-check --no-cache-dir)

# 1. Without Go the install fails, with the line that names the wheel route. PATH holds only
# the venv (pip runs the build backend with the venv's own interpreter).
if (cd "$root" && "${clean_env[@]}" PATH="$work/venv/bin" "$vpy" "${pipq[@]}" ./python) >"$work/nogo.log" 2>&1; then
  echo "tools/readme-python.sh: pip install ./python succeeded without Go on PATH"; exit 1
fi
if ! grep -q "dfkv: cannot build libdfkv.so: Go >= 1.26 is not on PATH.*//python:wheel_linux" "$work/nogo.log"; then
  echo "tools/readme-python.sh: the Go-less install did not fail with the expected line:"; tail -30 "$work/nogo.log"; exit 1
fi
echo "without Go: $(grep -o 'dfkv: cannot build libdfkv.so: Go.*' "$work/nogo.log" | head -1)"

# 2. The README's install line, as written, from the checkout's root.
t0=$(date +%s)
(cd "$root" && "${clean_env[@]}" "$vpy" "${pipq[@]}" ./python)
echo "pip install ./python: $(( $(date +%s) - t0 )) s"

# 3. A real server on loopback, on a port it picks.
"$server" --host 127.0.0.1 --port 0 --addr-file "$work/addr" --dir "$work/data" --cap 256MiB \
  >"$work/server.log" 2>&1 &
spid=$!
for _ in $(seq 1 300); do
  [ -s "$work/addr" ] && break
  kill -0 "$spid" 2>/dev/null || { echo "tools/readme-python.sh: dfkv_server exited:"; cat "$work/server.log"; exit 1; }
  sleep 0.05
done
[ -s "$work/addr" ] || { echo "tools/readme-python.sh: dfkv_server wrote no address in 15 s"; cat "$work/server.log"; exit 1; }
addr=$(cat "$work/addr")

# 4. The example exactly as README.md has it, from outside the checkout.
"$py" - "$root/README.md" >"$work/example.py" <<'PY'
import re, sys, textwrap
s = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r"<!-- python-example.*?-->\s*\n\s*```python\n(.*?)\n\s*```\s*\n\s*<!-- end python-example -->", s, re.S)
if not m:
    sys.exit("tools/readme-python.sh: README.md has no python-example block")
print(textwrap.dedent(m.group(1)))
PY
mkdir "$work/elsewhere"
cd "$work/elsewhere"
lib=$("${clean_env[@]}" timeout 60 "$vpy" -c 'import dfkv, dfkv._lib as l; dfkv.version(); print(l.loaded_path())')
case $lib in
  "$work"/venv/*) echo "libdfkv.so loaded from the installed package: $lib" ;;
  *) echo "tools/readme-python.sh: libdfkv.so came from $lib, not the installed package"; exit 1 ;;
esac
out=$("${clean_env[@]}" DFKV_MEMBERS="n1=$addr" timeout 120 "$vpy" "$work/example.py") || {
  echo "tools/readme-python.sh: the README's Python example failed:"; echo "$out"; cat "$work/example.py"; exit 1; }
echo "$out"
# What the example's comments promise.
grep -qx "b'hello, kv'" <<<"$out" && grep -qx "None" <<<"$out" && grep -q "^refused: " <<<"$out" || {
  echo "tools/readme-python.sh: the example ran but printed something else than its comments say"; exit 1; }
echo "tools/readme-python.sh: the README's Python example runs as written"
