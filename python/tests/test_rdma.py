"""RDMA through the real libdfkv.so and a real dfkv_server, over the soft provider (the
software NIC: the server process and the client process are the two hosts). The client runs
in a fresh interpreter because the library reads DFKV_RDMA* when it loads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap
import time
import urllib.request

import pytest

from conftest import SERVER_BIN, missing_build, run_python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rdma_server(tmp_path_factory):
    why = missing_build()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("rdma_server")
    addr_file = tmp / "addr"
    mport = _free_port()
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(addr_file),
         "--dir", str(tmp / "data"), "--cap", str(512 << 20), "--max-msg", str(64 << 20), "--metrics-port", str(mport),
         "--rdma", "--rdma-provider", "soft"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15
        addr = ""
        while time.monotonic() < deadline and proc.poll() is None:
            if addr_file.is_file() and addr_file.read_text().strip():
                addr = addr_file.read_text().strip()
                break
            time.sleep(0.02)
        if not addr:
            pytest.fail("dfkv_server --rdma did not start:\n" + (tmp / "server.log").read_text(errors="replace")[-4000:])
        yield addr, mport
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def _metric(mport: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exported")


CLIENT = textwrap.dedent("""
    import hashlib, os
    import dfkv
    c = dfkv.Client("n1=" + os.environ["ADDR"], namespace=b"py\\0rdma")
    reg = bytearray(1 << 20)
    assert c.register_memory(reg)
    assert c.register_memory(reg)  # idempotent
    for i, n in enumerate([1, 4096, (1 << 20) + 3, 4 << 20, 64 << 20]):
        v = hashlib.shake_256(bytes([i])).digest(n)
        assert c.put(b"k%d" % i, v), n
        out = bytearray(n)
        assert c.get_into(b"k%d" % i, out), n
        assert bytes(out) == v, n
        assert c.exist(b"k%d" % i), n
        assert not c.get_into(b"k%d" % i, bytearray(n + 1)), n  # exact size contract
    src = hashlib.shake_256(b"reg").digest(len(reg))
    reg[:] = src
    assert c.put(b"reg", reg)
    reg[:] = bytes(len(reg))
    assert c.get_into(b"reg", reg) and bytes(reg) == src
    print(c.transport_mode)
    c.close()
""")


def test_python_over_soft_rdma(rdma_server):
    addr, mport = rdma_server
    before = _metric(mport, "dfkv_rdma_v2_put_writes_total")
    r = run_python(CLIENT, env={"ADDR": addr, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": "soft", "DFKV_IO_TIMEOUT_MS": "30000"}, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip() == "rdma", r.stdout
    # 1 B .. 4 MiB and the registered value went over RDMA; 64 MiB over TCP.
    assert _metric(mport, "dfkv_rdma_v2_put_writes_total") - before == 5
    assert _metric(mport, "dfkv_rdma_completion_errors_total") == 0


def test_python_rdma_asked_but_server_without_it(server):
    r = run_python(CLIENT, env={"ADDR": server, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": "soft"}, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    mode = r.stdout.strip()
    assert mode.startswith("tcp(") and "does not serve RDMA" in mode, mode
