"""DMA-BUF registration (GPU-direct loads, issue 32) through the real libdfkv.so and a real
dfkv_server: argument errors, TCP-only clients (DirectUnsupported, never a CPU write into the
device range), and, over the soft RDMA provider, GETs landing in the device memory.

The stand-in for a device allocation is a memfd the test maps itself: the soft provider maps
the fd separately, so bytes the NIC writes show up in the test's mapping, and that mapping is
what every check reads (never a host staging buffer)."""

from __future__ import annotations

import mmap
import os

import pytest

import dfkv
from dfkv import _abi
from conftest import _run_server, run_python

pytestmark = pytest.mark.server

PROVIDER = os.environ.get("DFKV_TEST_RDMA_PROVIDER", "soft")


def _memfd(size: int):
    fd = os.memfd_create("dfkv-test-dmabuf", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return fd, m, addr


def test_register_dmabuf_argument_errors(client):
    with pytest.raises(dfkv.InvalidRequest) as ei:
        client.register_dmabuf(-1, 0, 4096, 0x10000)
    assert ei.value.status == _abi.STATUS_INVALID
    with pytest.raises(dfkv.InvalidRequest):
        client.register_dmabuf(0, 0, 0, 0x10000)  # zero bytes
    with pytest.raises(dfkv.InvalidRequest):
        client.register_dmabuf(0, 0, 4096, 0)  # no iova
    with pytest.raises(dfkv.InvalidRequest):
        client.register_dmabuf(0, 0, 1 << 20, (1 << 64) - 4096)  # wraps around
    with pytest.raises(dfkv.DfkvError, match="fd must be an int"):
        client.register_dmabuf("3", 0, 4096, 0x10000)
    with pytest.raises(dfkv.DfkvError, match="non-negative int"):
        client.register_dmabuf(3, -1, 4096, 0x10000)


def test_unregister_dmabuf_unknown_range_is_invalid(client):
    with pytest.raises(dfkv.InvalidRequest) as ei:
        client.unregister_dmabuf(0x10000, 4096)
    assert ei.value.status == _abi.STATUS_INVALID and "unregister_dmabuf" in str(ei.value)


def test_device_destinations_outside_registered_ranges_are_refused(client):
    assert client.put(b"k", b"v" * 64)
    with pytest.raises(dfkv.DfkvError, match="not inside a range registered with register_dmabuf"):
        client.get_into(b"k", (0x10000, 64))
    with pytest.raises(dfkv.DfkvError, match="register_dmabuf"):
        client.get_into(b"k", dfkv.RawBuffer(0x10000, 64, device=True))
    with pytest.raises(dfkv.DfkvError, match="device memory"):
        client.put(b"k2", dfkv.RawBuffer(0x10000, 64, device=True))  # never a PUT source
    with pytest.raises(dfkv.DfkvError, match="raw region"):
        client.batch_get_auto_sg([b"k"], [[(0x10000,)]])


def test_tcp_client_direct_unsupported(client):
    """No RDMA: registering device memory, or a GET into it, is DirectUnsupported; the
    library never writes the range with the CPU (or over TCP)."""
    assert client.transport_mode == "tcp"
    val = os.urandom(3000)
    assert client.put(b"dev", val)
    fd, m, addr = _memfd(1 << 16)
    try:
        try:
            client.register_dmabuf(fd, 0, 1 << 16, addr)
        except dfkv.DirectUnsupported as e:
            assert e.status == _abi.STATUS_DIRECT_UNSUPPORTED
        else:  # recorded: every GET into it must refuse with DirectUnsupported
            assert client.get_into(b"dev", (addr + 4096, len(val))) is False
            assert client.last_status() == _abi.STATUS_DIRECT_UNSUPPORTED, client.last_error()
            assert isinstance(client.last_exception(), dfkv.DirectUnsupported)
            assert client.batch_get_auto_sg([b"dev"], [[(addr, 1000), (addr + 8192, 2000)]]) == [(False, 0)]
            assert client.get_auto(b"dev", (addr, 1 << 16)) == (False, 0)
            assert client.last_status() == _abi.STATUS_DIRECT_UNSUPPORTED
            assert m[:] == bytes(1 << 16), "a refused device GET wrote the memory"
            client.unregister_dmabuf(addr, 1 << 16)
            with pytest.raises(dfkv.InvalidRequest):
                client.unregister_dmabuf(addr, 1 << 16)
        # host GETs still work on this client
        assert client.get(b"dev", len(val)) == val
    finally:
        m.close()
        os.close(fd)


@pytest.fixture(scope="module")
def rdma_server(tmp_path_factory):
    yield from _run_server(tmp_path_factory, "dfkv_server_dmabuf", "--rdma", "--rdma-provider", PROVIDER,
                           "--rdma-segment", str(64 << 20))


DIRECT_CLIENT = r"""
import ctypes, mmap, os, sys
import dfkv
from dfkv import _abi

def stat(c, name):
    for line in c.stats_snapshot().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0

SIZE = 1 << 20
fd = os.memfd_create("dfkv-dmabuf", os.MFD_CLOEXEC)
os.ftruncate(fd, SIZE)
dev = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
iova = ctypes.addressof(ctypes.c_char.from_buffer(dev))
c = dfkv.Client("n1=" + os.environ["ADDR"], namespace=b"py\0dmabuf")
vals = [os.urandom(n) for n in (1, 4096, 100000)]
keys = [b"d%d" % i for i in range(len(vals))]
assert c.batch_put(keys, vals) == [True] * len(vals)
assert c.transport_mode == "rdma", c.transport_mode
c.register_dmabuf(fd, 0, SIZE, iova)
os.close(fd)  # the registration holds its own reference
staged = stat(c, "dfkv_rdma_staged_ops_total")
# single GETs into the device memory
assert c.get_into(keys[2], (iova + 8192, len(vals[2]))), c.last_error()
assert dev[8192:8192 + len(vals[2])] == vals[2]
ok, n = c.get_auto(keys[1], (iova + 300000, 8192))
assert ok and n == 4096 and dev[300000:304096] == vals[1], c.last_error()
# a batch and a scatter-gather batch
dev[:] = bytes(SIZE)
offs = [0, 4096, 16384]
assert c.batch_get_into(keys, [(iova + o, len(v)) for o, v in zip(offs, vals)]) == [True] * 3, c.last_error()
assert all(dev[o:o + len(v)] == v for o, v in zip(offs, vals))
dev[:] = bytes(SIZE)
res = c.batch_get_auto_sg([keys[2]], [[(iova + 500000, 40000), (iova + 900, 60000)]])
assert res == [(True, 100000)], (res, c.last_error())
assert dev[500000:540000] == vals[2][:40000] and dev[900:60900] == vals[2][40000:]
assert stat(c, "dfkv_rdma_staged_ops_total") == staged, "a device GET went through host staging"
c.unregister_dmabuf(iova, SIZE)
try:
    c.unregister_dmabuf(iova, SIZE)
    raise SystemExit("second unregister_dmabuf succeeded")
except dfkv.InvalidRequest:
    pass
try:
    c.get_into(keys[0], (iova, 1))
    raise SystemExit("a raw destination outside every registration was accepted")
except dfkv.DfkvError:
    pass
c.close()
print("ok")
"""


def test_direct_gets_land_in_device_memory_over_soft_rdma(rdma_server):
    r = run_python(DIRECT_CLIENT, env={"ADDR": rdma_server, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": PROVIDER,
                                       "DFKV_IO_TIMEOUT_MS": "30000"}, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
