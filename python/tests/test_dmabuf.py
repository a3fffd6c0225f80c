"""DMA-BUF registration (GPU-direct loads, issue 32) through the real libdfkv.so and a real
dfkv_server: argument errors, TCP-only clients (DirectUnsupported, never a CPU write into the
device range), and, over the soft RDMA provider, GETs landing in the device memory.

The stand-in for a device allocation is ``devmem.DeviceMemory``: a udmabuf (a real DMA-BUF over
a sealed memfd) where the kernel has /dev/udmabuf, else the memfd itself; the test ids say
which ran ([udmabuf] / [memfd]). The test maps the memory itself and the soft provider maps the
fd separately, so bytes the NIC writes show up in the test's mapping, and that mapping is what
every check reads (never a host staging buffer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dfkv
from dfkv import _abi
import devmem
from conftest import PYTHON_DIR, _run_server, run_python

pytestmark = pytest.mark.server

PROVIDER = os.environ.get("DFKV_TEST_RDMA_PROVIDER", "soft")
DEVKIND = devmem.kind()  # which stand-in device memory this host gets (in the test ids)
devkind = pytest.mark.parametrize("devkind", [DEVKIND])


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


@devkind
def test_tcp_client_direct_unsupported(client, devkind):
    """No RDMA: registering device memory, or a GET into it, is DirectUnsupported; the
    library never writes the range with the CPU (or over TCP)."""
    assert client.transport_mode == "tcp"
    val = os.urandom(3000)
    assert client.put(b"dev", val)
    dev = devmem.DeviceMemory(1 << 16)
    assert dev.kind == devkind
    fd, m, addr = dev.fd, dev.mem, dev.addr
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
        dev.close()


@pytest.fixture(scope="module")
def rdma_server(tmp_path_factory):
    yield from _run_server(tmp_path_factory, "dfkv_server_dmabuf", "--rdma", "--rdma-provider", PROVIDER,
                           "--rdma-segment", str(64 << 20))


DIRECT_CLIENT = r"""
import os, sys
import dfkv
import devmem
from dfkv import _abi

def stat(c, name):
    for line in c.stats_snapshot().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0

SIZE = 1 << 20
mem = devmem.DeviceMemory(SIZE)
print("device memory:", mem.kind)
assert mem.kind == os.environ["DEVKIND"], mem
dev, iova = mem.mem, mem.addr
c = dfkv.Client("n1=" + os.environ["ADDR"], namespace=b"py\0dmabuf")
vals = [os.urandom(n) for n in (1, 4096, 100000)]
keys = [b"d%d" % i for i in range(len(vals))]
assert c.batch_put(keys, vals) == [True] * len(vals)
assert c.transport_mode == "rdma", c.transport_mode
try:
    c.register_dmabuf(mem.fd, 0, SIZE, iova)
except dfkv.DirectUnsupported as e:
    # a hardware NIC may not import DMA-BUFs (rxe: EOPNOTSUPP, errno 95): the refusal must
    # say the driver's errno; the soft provider always imports the stand-in
    assert os.environ["PROVIDER"] != "soft" and "errno" in str(e), e
    assert c.get(keys[2], len(vals[2])) == vals[2]  # host GETs still work after it
    print("refused:", e)
    print("ok")
    sys.exit(0)
mem.close_fd()  # the registration holds its own reference
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


@devkind
def test_direct_gets_land_in_device_memory_over_soft_rdma(rdma_server, devkind):
    tests = str(Path(__file__).resolve().parent)  # devmem
    r = run_python(DIRECT_CLIENT, env={"ADDR": rdma_server, "DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": PROVIDER,
                                       "DFKV_IO_TIMEOUT_MS": "30000", "DEVKIND": devkind, "PROVIDER": PROVIDER,
                                       "PYTHONPATH": os.pathsep.join([str(PYTHON_DIR), tests])},
                   timeout=300)
    print(r.stdout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    assert f"device memory: {devkind}" in r.stdout
