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

# The provider under test: the soft NIC by default, ibverbs on a real verbs stack (the
# Soft-RoCE guest, tools/rdma-vm, sets DFKV_TEST_RDMA_PROVIDER=ibverbs).
PROVIDER = os.environ.get("DFKV_TEST_RDMA_PROVIDER", "soft")
# Deadlines stretch on a slow fabric (Soft-RoCE under emulation), as in the Go e2e tests.
FABRIC_SCALE = int(os.environ.get("DFKV_TEST_FABRIC_SCALE", "1"))


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
         "--rdma", "--rdma-provider", PROVIDER, "--rdma-segment", str(640 << 20)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15 * FABRIC_SCALE
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
    r = run_python(CLIENT, env={"ADDR": addr, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": PROVIDER, "DFKV_IO_TIMEOUT_MS": "30000"}, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip() == "rdma", r.stdout
    # 1 B .. 4 MiB and the registered value went over RDMA; 64 MiB over TCP.
    assert _metric(mport, "dfkv_rdma_v2_put_writes_total") - before == 5
    assert _metric(mport, "dfkv_rdma_completion_errors_total") == 0


def test_python_rdma_asked_but_server_without_it(server):
    # The 64 MiB value goes over TCP: under emulation (tools/rdma-vm) that outlasts the 5 s default.
    r = run_python(CLIENT, env={"ADDR": server, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": PROVIDER, "DFKV_IO_TIMEOUT_MS": "30000"},
                   timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    mode = r.stdout.strip()
    assert mode.startswith("tcp(") and "does not serve RDMA" in mode, mode


def _requests(mport: int, op: str) -> float:
    """dfkv_server_requests_total for one op (every status): what went over TCP."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    prefix = f'dfkv_server_requests_total{{op="{op}"'
    return sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith(prefix))


BATCH_CLIENT = textwrap.dedent("""
    import hashlib, os
    import dfkv

    def stat(c, name):
        for line in c.stats_snapshot().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(name + " missing from the stats snapshot")

    c = dfkv.Client("n1=" + os.environ["ADDR"], namespace=b"py\\0rdma-batch")
    sizes = [1, 4095, 65537, 1 << 20, (4 << 20) + 7, 64 << 20]
    keys = [b"b%d" % i for i in range(len(sizes))]
    vals = [hashlib.shake_256(b"v%d" % i).digest(n) for i, n in enumerate(sizes)]
    assert c.batch_put(keys, vals) == [True] * len(sizes)
    bufs = [bytearray(n) for n in sizes]
    assert c.batch_get_into(keys, bufs) == [True] * len(sizes)
    assert [bytes(b) for b in bufs] == vals
    segs = [[bytearray(n // 2), bytearray(n - n // 2)] if n > 1 else [bytearray(1)] for n in sizes]
    got = c.batch_get_auto_sg(keys, segs)
    assert got == [(True, n) for n in sizes], got
    assert [b"".join(bytes(x) for x in s) for s in segs] == vals
    assert c.batch_exist(keys + [b"absent"]) == [True] * len(sizes) + [False]
    sgkeys = [b"s%d" % i for i in range(len(sizes))]
    assert c.batch_put_sg(sgkeys, [[v[: len(v) // 2], v[len(v) // 2:]] if len(v) > 1 else [v] for v in vals]) == [True] * len(sizes)
    sgbufs = [bytearray(n) for n in sizes]
    assert c.batch_get_into(sgkeys, sgbufs) == [True] * len(sizes) and [bytes(b) for b in sgbufs] == vals
    # a registered pool (as an engine connector's KV pool): pool MRs, nothing ad hoc or staged
    pool = bytearray(4 << 20)
    assert c.register_memory(pool)
    view = memoryview(pool)
    blocks = [view[i << 20:(i + 1) << 20] for i in range(4)]
    for i, b in enumerate(blocks):
        b[:] = hashlib.shake_256(b"p%d" % i).digest(1 << 20)
    want = [bytes(b) for b in blocks]
    before = {n: stat(c, n) for n in ("dfkv_rdma_mr_pool_ops_total", "dfkv_rdma_mr_adhoc_registrations_total", "dfkv_rdma_staged_ops_total")}
    pkeys = [b"p%d" % i for i in range(4)]
    assert c.batch_put(pkeys, blocks) == [True] * 4
    pool[:] = bytes(len(pool))
    assert c.batch_get_into(pkeys, blocks) == [True] * 4 and [bytes(b) for b in blocks] == want
    assert stat(c, "dfkv_rdma_mr_pool_ops_total") - before["dfkv_rdma_mr_pool_ops_total"] == 8
    assert stat(c, "dfkv_rdma_mr_adhoc_registrations_total") == before["dfkv_rdma_mr_adhoc_registrations_total"]
    assert stat(c, "dfkv_rdma_staged_ops_total") == before["dfkv_rdma_staged_ops_total"]
    # transient MRs of the C ABI are released with their op, never cached
    assert stat(c, "dfkv_rdma_mr_adhoc_registrations_total") == stat(c, "dfkv_rdma_mr_adhoc_releases_total") > 0
    assert stat(c, "dfkv_rdma_mr_cache_bytes") == 0
    # one device, one PD and one registration of the pool, shared by the connections
    assert stat(c, "dfkv_rdma_devices_open") == 1 and stat(c, "dfkv_rdma_pds_open") == 1
    assert stat(c, "dfkv_rdma_mr_pool_registrations_total") == 1
    # unregister: deregistered once, unpinned; a second unregister is refused with a reason
    assert c.unregister_memory(pool)
    assert stat(c, "dfkv_rdma_mr_pool_deregistrations_total") == 1 and stat(c, "dfkv_rdma_mr_pool_bytes") == 0
    assert not c.unregister_memory(pool)
    assert "not registered" in c.last_error(), c.last_error()
    # plain memory again: byte-exact, not pool ops
    pool_ops = stat(c, "dfkv_rdma_mr_pool_ops_total")
    for i, b in enumerate(blocks):
        b[:] = hashlib.shake_256(b"q%d" % i).digest(1 << 20)
    want = [bytes(b) for b in blocks]
    assert c.batch_put(pkeys, blocks) == [True] * 4
    pool[:] = bytes(len(pool))
    assert c.batch_get_into(pkeys, blocks) == [True] * 4 and [bytes(b) for b in blocks] == want
    assert stat(c, "dfkv_rdma_mr_pool_ops_total") == pool_ops
    assert c.batch_remove(keys) == [True] * len(sizes)
    assert c.batch_exist(keys) == [False] * len(sizes)
    del view, blocks, b
    pool.extend(b"x")  # unpinned by unregister_memory: resizable again
    import sys
    sys.stderr.write(chr(10).join(l for l in c.stats_snapshot().splitlines() if "rdma" in l and not l.startswith("#")))
    print(c.transport_mode)
    c.close()
""")


def test_python_batch_sg_over_soft_rdma(rdma_server):
    """Batch, scatter-gather and registered-pool calls, 1 B - 64 MiB, all over RDMA v2
    (declared block 64 MiB): the server counts the writes and no batch frame on TCP."""
    addr, mport = rdma_server
    before = _metric(mport, "dfkv_rdma_v2_put_writes_total")
    tcp_before = {op: _requests(mport, op) for op in ("BatchPut", "BatchGet", "BatchExist", "BatchRemove")}
    r = run_python(BATCH_CLIENT, env={"ADDR": addr, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": PROVIDER,
                                      "DFKV_RDMA_MAX_BLOCK": str(64 << 20), "DFKV_RDMA_DEPTH": "2",
                                      "DFKV_IO_TIMEOUT_MS": "60000"}, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip() == "rdma", r.stdout
    # 6 batch puts, 6 scatter-gather puts, 4 from the registered pool, 4 after unregistering it
    assert _metric(mport, "dfkv_rdma_v2_put_writes_total") - before == 20, r.stderr + str({op: _requests(mport, op) for op in tcp_before})
    assert {op: _requests(mport, op) for op in tcp_before} == tcp_before
    assert _metric(mport, "dfkv_rdma_completion_errors_total") == 0
