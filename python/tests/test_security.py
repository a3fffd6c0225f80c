"""TLS and tenant tokens from Python: libdfkv reads DFKV_TLS_CA / DFKV_TLS_CERT / DFKV_TLS_KEY,
DFKV_TOKEN and DFKV_TENANT when a client opens, so a Python process passes them through its
environment (set before the library loads: each case runs in a fresh interpreter). A real
dfkv_server runs with TLS 1.3 and a token file; certificates come from
``dfkv_bench tls-testcerts``."""

from __future__ import annotations

import subprocess
import time

import pytest

from conftest import BUILD, SERVER_BIN, missing_build, run_python

pytestmark = pytest.mark.server

BENCH_BIN = BUILD / "dfkv_bench"

CODE = """
import dfkv, sys
c = dfkv.Client(members="n1=%s", namespace=b"py-sec")
ok = c.put(b"k", b"tenant a's value")
got = c.get(b"k", len(b"tenant a's value"))
print("put=%%s get=%%r" %% (ok, got))
"""


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory):
    why = missing_build() or ("" if BENCH_BIN.is_file() else f"not built: {BENCH_BIN} (run tools/build.sh)")
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("dfkv_tls")
    subprocess.run([str(BENCH_BIN), "tls-testcerts", "--dir", str(tmp), "--hosts", "127.0.0.1"], check=True,
                   capture_output=True, timeout=60)
    (tmp / "tokens").write_text("tok-a read,write,remove team-a\ntok-b read,write,remove team-b\n")
    addr_file = tmp / "addr"
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(addr_file), "--dir",
         str(tmp / "data"), "--cap", str(64 << 20), "--store-engine", "mem",
         "--tls-cert", str(tmp / "server.crt"), "--tls-key", str(tmp / "server.key"),
         "--auth-tokens", str(tmp / "tokens")],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if addr_file.is_file() and addr_file.read_text().strip():
                break
            time.sleep(0.02)
        addr = addr_file.read_text().strip() if addr_file.is_file() else ""
        if not addr:
            pytest.fail("dfkv_server (TLS) did not start:\n" + (tmp / "server.log").read_text(errors="replace"))
        yield addr, tmp
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def run(addr, env):
    r = run_python(CODE % addr, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_tls_and_token_pass_through(secure_server):
    addr, d = secure_server
    out = run(addr, {"DFKV_TLS_CA": str(d / "ca.crt"), "DFKV_TOKEN": "tok-a", "DFKV_TENANT": "team-a"})
    assert out == "put=True get=b\"tenant a's value\""


@pytest.mark.parametrize("env", [
    {"DFKV_TOKEN": "tok-a", "DFKV_TENANT": "team-a"},  # plaintext to a TLS server
    {"DFKV_TLS_CA": "CA", "DFKV_TOKEN": "tok-b", "DFKV_TENANT": "team-a"},  # another tenant's token
    {"DFKV_TLS_CA": "CA", "DFKV_TENANT": "team-a"},  # no token
], ids=["plaintext", "wrong-tenant-token", "no-token"])
def test_refused(secure_server, env):
    addr, d = secure_server
    env = {k: (str(d / "ca.crt") if v == "CA" else v) for k, v in env.items()}
    assert run(addr, env) == "put=False get=None"


def test_bad_ca_file_refuses_open(secure_server):
    addr, d = secure_server
    r = run_python(CODE % addr, env={"DFKV_TLS_CA": str(d / "missing.crt"), "DFKV_LOG": "1"})
    assert r.returncode != 0
    assert "DFKV_TLS_CA" in r.stderr


RAISING = """
import dfkv
c = dfkv.Client(members="n1=%s", namespace=b"py-sec")
for what, call in (("set", lambda: c.set(b"k2", b"v")), ("get", lambda: c.get(b"k2"))):
    try:
        print(what, "returned", repr(call()))
    except dfkv.Error as e:
        print(what, type(e).__name__, e.status)
"""


@pytest.mark.parametrize("env,want", [
    ({"DFKV_TLS_CA": "CA", "DFKV_TOKEN": "tok-a", "DFKV_TENANT": "team-a"}, "set returned None\nget returned b'v'"),
    ({"DFKV_TLS_CA": "CA", "DFKV_TOKEN": "tok-b", "DFKV_TENANT": "team-a"}, "set Forbidden 4\nget Forbidden 4"),
    ({"DFKV_TLS_CA": "CA", "DFKV_TENANT": "team-a"}, "set Forbidden 4\nget Forbidden 4"),
], ids=["granted", "wrong-tenant-token", "no-token"])
def test_refusal_raises_forbidden(secure_server, env, want):
    """The raising forms turn a refused token into dfkv.Forbidden (status 4), not a miss."""
    addr, d = secure_server
    env = {k: (str(d / "ca.crt") if v == "CA" else v) for k, v in env.items()}
    r = run_python(RAISING % addr, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want
