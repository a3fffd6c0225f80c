"""The vLLM connector's direct GPU loads (``direct_gpu: true``) under vLLM's own Scheduler.

The dfkv side is the real libdfkv.so and a real dfkv_server serving RDMA over the soft
provider (the software NIC). The "device memory" is ``devmem.DeviceMemory`` (a udmabuf where
the kernel has /dev/udmabuf, else a memfd; the test ids say which: [udmabuf] / [memfd]), which
the test maps itself: the KV cache tensors are torch views over that mapping (at non-zero
storage offsets), and the connector's DMA-BUF seam (``dmabuf_exporter``) hands the library the
DMA-BUF fd, which the soft provider maps separately. Bytes the server's RDMA WRITEs deliver
therefore show up in the test's own mapping, which is what ``VllmEngine.block_ok`` reads; no
host staging buffer is involved (the connector's staging counters and the client's staged-op
counter stay 0).
"""

from __future__ import annotations

import math
import os
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("vllm.v1.core.sched.scheduler", reason="vllm is not installed (tools/test.sh installs vllm==0.33.0 --no-deps)")

import torch  # noqa: E402
from engine_support import VLLM_BLOCK, VllmEngine, vllm_request  # noqa: E402
import devmem  # noqa: E402  (tests/, on the path as conftest's directory)

pytestmark = pytest.mark.server

PROMPT = list(range(200, 214))  # 14 tokens: 3 full blocks of 4 can come from dfkv
PROVIDER = os.environ.get("DFKV_TEST_RDMA_PROVIDER", "soft")
DEVKIND = devmem.kind()  # which stand-in device memory this host gets (in the test ids)


@pytest.fixture(scope="module")
def rdma_members(tmp_path_factory):
    from conftest import _run_server

    for addr in _run_server(tmp_path_factory, "dfkv_server_vllm_direct", "--rdma", "--rdma-provider", PROVIDER,
                            "--rdma-segment", str(64 << 20)):
        yield f"n1={addr}"


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def rdma_env(monkeypatch):
    # libdfkv reads DFKV_RDMA* from the live environment when a client opens; monkeypatch
    # restores them (the connector's own DFKV_RDMA=1 included) after the test.
    monkeypatch.setenv("DFKV_RDMA", "1")
    monkeypatch.setenv("DFKV_RDMA_PROVIDER", PROVIDER)
    monkeypatch.setenv("DFKV_IO_TIMEOUT_MS", "30000")


class DevCaches:
    """make_caches for VllmEngine: every rank's layers as bf16 views into one stand-in device
    allocation (devmem.DeviceMemory), the first at a non-zero storage offset and with gaps
    between layers; the worker's dmabuf_exporter returns (a dup of) its DMA-BUF fd and the
    storage's offset in it. ``page_first``: the layers interleave instead, every layer's page
    of a block in one block row ((num_blocks, layers, ...), vLLM's block-outermost layouts)."""

    def __init__(self, lead: int = 4096 + 256, gap: int = 512, page_first: bool = False):
        self.lead, self.gap, self.page_first = lead, gap, page_first
        self.exports = []  # (ptr, size) the connector exported
        self.keep = []

    def __call__(self, rank, worker, shapes):
        sizes = {n: math.prod(sh) * 2 for n, sh in shapes.items()}
        total = self.lead + sum(sizes.values()) + self.gap * len(sizes)
        dev = devmem.DeviceMemory(total, name=f"dfkv-vllm-direct-{rank}")
        print(f"device memory: {dev.kind}")
        raw = torch.frombuffer(dev.mem, dtype=torch.uint8)
        base = raw.untyped_storage().data_ptr()
        caches, off = {}, self.lead
        if self.page_first:
            sh = next(iter(shapes.values()))
            assert all(s == sh for s in shapes.values())
            rows = raw[off:off + sum(sizes.values())].view(torch.bfloat16).view((sh[0], len(shapes)) + sh[1:])
            caches = {n: rows[:, i] for i, n in enumerate(shapes)}  # (num_blocks, ...), strided
        else:
            for n, sh in shapes.items():
                caches[n] = raw[off:off + sizes[n]].view(torch.bfloat16).view(sh)
                off += sizes[n] + self.gap
        assert all(t.storage_offset() > 0 for t in caches.values())

        def export(ptr, size, tensor):
            assert tensor.device.type == "cpu"
            self.exports.append((ptr, size))
            return dev.export(), ptr - base

        worker.dmabuf_exporter = export
        self.keep.append((dev, raw))
        return caches


def _write(members, tenant, **kw):
    w = VllmEngine(members, tenant, **kw)  # the host-staging path (the default) stores
    w.add(vllm_request("writer", PROMPT))
    w.run(["writer"])
    assert w.computed_by_forward["writer"] == len(PROMPT)
    return w


def _fragment(engine, ids=(11, 3, 8, 5, 14, 2, 9)):
    """Leave only the given blocks free, in that order: the next request's blocks are not
    consecutive."""
    bp = engine.sched.kv_cache_manager.block_pool
    taken = {b.block_id: b for b in bp.get_new_blocks(bp.get_num_free_blocks())}
    bp.free_blocks([taken[i] for i in ids])


def _direct_reader(members, tenant, caches, **kw):
    r = VllmEngine(members, tenant, make_caches=caches, direct_gpu=True, **kw)
    w = r.worker
    assert w.direct and w._dmabufs and caches.exports
    seen, errors = [], []
    orig_load, orig_err = w._load_direct, w.get_block_ids_with_load_errors

    def load(x):
        seen.append([bid for _, _, bid, _ in x.items])
        return orig_load(x)

    def errs():
        out = orig_err()
        errors.extend(sorted(out))
        return out

    w._load_direct, w.get_block_ids_with_load_errors = load, errs
    return r, seen, errors


def _stat(c, name):
    for line in c.stats_snapshot().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the client's stats")


@pytest.mark.parametrize("devkind", [DEVKIND])
@pytest.mark.parametrize("layout", ["split", "contiguous"])
def test_direct_load_lands_stored_bytes_in_device_memory(rdma_members, tenant, rdma_env, layout, devkind):
    _write(rdma_members, tenant)  # split layout, host staging
    caches = DevCaches()
    r, seen, errors = _direct_reader(rdma_members, tenant, caches, layout=layout)
    assert caches.keep[0][0].kind == devkind
    # one registration per KV cache storage (both layers share one allocation), its range
    assert len(caches.exports) == 1 and caches.exports[0][1] == caches.keep[0][1].numel()
    _fragment(r)
    r.add(vllm_request("reader", PROMPT))
    assert r.step().num_scheduled_tokens == {}  # lookup in flight
    r.settle()
    r.run(["reader"])
    assert "ERROR" not in str(r.finished["reader"].finish_reason)
    assert len(seen) == 1 and len(seen[0]) == 3
    ids = seen[0]
    assert any(b - a != 1 for a, b in zip(ids, ids[1:])), f"block ids {ids} are consecutive"
    # three blocks loaded, byte-exact, read from the test's own mapping
    assert r.first_forward["reader"] == (3 * VLLM_BLOCK, True)
    assert r.computed_by_forward["reader"] == len(PROMPT) - 3 * VLLM_BLOCK
    assert errors == []
    st = r.worker.stats()
    obj = r.worker._obj_bytes[0]
    assert (st["direct_loads"], st["direct_load_objects"], st["direct_load_bytes"]) == (1, 3, 3 * obj)
    assert st["direct_failed_blocks"] == 0 and st["direct_registrations"] == 1
    assert st["direct_resolve_s"] >= 0 and st["direct_io_s"] > 0
    assert (st["staged_loads"], st["staged_load_objects"], st["staged_load_bytes"]) == (0, 0, 0)
    assert r.worker._load_buf is None  # the host load buffer was never even allocated
    c = r.worker._client.peek()
    assert c.transport_mode == "rdma"
    assert _stat(c, "dfkv_rdma_staged_ops_total") == 0
    r.worker.shutdown()  # unregisters the DMA-BUF, closes the fds


@pytest.mark.parametrize("policy", [None, "recompute"], ids=["default-fail-policy", "recompute-policy"])
def test_direct_load_error_is_reported_as_block_error(rdma_members, tenant, rdma_env, policy):
    import dfkv

    w = _write(rdma_members, tenant)
    caches = DevCaches()
    r, seen, errors = _direct_reader(rdma_members, tenant, caches, policy=policy)
    req = vllm_request("reader", PROMPT)
    r.add(req)
    r.step()
    r.settle()  # the lookup leased three blocks
    # the third block's object leaves the server between lookup and load
    with dfkv.Client(rdma_members, namespace=w.worker._client.namespace) as c:
        assert c.remove(w.worker._key(bytes(req.block_hashes[2]), 0, 0, 0))
    r.run(["reader"])
    assert len(seen) == 1
    assert errors == [seen[0][2]]  # exactly the missing block, through vLLM's API
    st = r.worker.stats()
    assert st["direct_failed_blocks"] == 1 and st["direct_load_objects"] == 2
    assert st["staged_loads"] == 0 and r.worker._load_buf is None  # no host-staging retry
    if policy == "recompute":
        before, intact = r.first_forward["reader"]
        assert before == 2 * VLLM_BLOCK and intact  # vLLM recomputes from the failed block
        assert "ERROR" not in str(r.finished["reader"].finish_reason)
    else:
        from vllm.v1.engine import FinishReason

        assert r.finished["reader"].finish_reason == FinishReason.ERROR  # vLLM's default: fail
    r.worker.shutdown()


def test_direct_load_without_rdma_fails_hard(members, tenant, rdma_env):
    """A server without RDMA (the session's TCP server): every direct load is a block error,
    nothing goes through the host, and the retry recomputes (no second load)."""
    _write(members, tenant)
    caches = DevCaches()
    r, seen, errors = _direct_reader(members, tenant, caches, policy="recompute")
    r.add(vllm_request("reader", PROMPT))
    r.run(["reader"])
    assert len(seen) == 1 and sorted(errors) == sorted(seen[0])
    assert r.computed_by_forward["reader"] == len(PROMPT)  # everything recomputed
    st = r.worker.stats()
    assert st["direct_failed_blocks"] == 3 and st["direct_load_bytes"] == 0 and st["staged_loads"] == 0
    r.worker.shutdown()


def test_hybrid_groups_refused_by_name(rdma_members, tenant):
    with pytest.raises(ValueError, match=r"direct_gpu does not serve hybrid KV cache layouts \(HMA\): 2 KV cache groups"):
        VllmEngine(rdma_members, tenant, groups=2, direct_gpu=True)


def test_mamba_group_refused_by_name(rdma_members, tenant):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec

    from engine_support import VLLM_LAYERS, vllm_configs

    cfg, kvc = vllm_configs(rdma_members, tenant, direct_gpu=True)
    kvc.kv_cache_groups = [KVCacheGroupSpec(layer_names=[VLLM_LAYERS[0]], kv_cache_spec=MambaSpec(
        block_size=VLLM_BLOCK, shapes=((2, 8),), dtypes=(torch.bfloat16,)))]
    with pytest.raises(ValueError, match="direct_gpu does not serve KV cache group spec MambaSpec"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kvc)


def test_layout_needing_too_many_segments_refused_by_name(rdma_members, tenant, rdma_env):
    """A head-major layout whose block is many small runs: one object would need more
    scatter-gather segments than the library takes, so direct mode refuses it at start."""
    caches = DevCaches()

    def hnd(rank, worker, shapes):
        got = caches(rank, worker, shapes)
        # (2, nb, block, heads, head) whose physical order is element-interleaved: a block is
        # block x heads x head runs of one element each
        return {n: t.view(-1).as_strided(t.shape, (1, 2, 2 * t.shape[1], 2 * t.shape[1] * t.shape[2],
                                                   2 * t.shape[1] * t.shape[2] * t.shape[3]))
                for n, t in got.items()}

    with pytest.raises(ValueError, match=r"direct_gpu: KV cache layout .* scatter-gather segments per block object"):
        VllmEngine(rdma_members, tenant, make_caches=hnd, direct_gpu=True)


def test_page_first_layout_refused_by_name(rdma_members, tenant, rdma_env):
    """A page-first layout (every layer's page of a block in one block row: vLLM's
    block-outermost BLHNC/BLNHC/BHLNC) is refused at start by name, from the tensors'
    geometry when the layout's name is not known; nothing is exported. The host-staging path
    takes the same tensors as before."""
    caches = DevCaches(page_first=True)
    with pytest.raises(ValueError, match=r"direct_gpu does not serve page-first KV cache layouts: layers .* "
                                         r"interleave in one allocation"):
        VllmEngine(rdma_members, tenant, make_caches=caches, layout="contiguous", direct_gpu=True)
    assert caches.exports == []
    staged = VllmEngine(rdma_members, tenant, make_caches=DevCaches(page_first=True), layout="contiguous")
    assert not staged.worker.direct and staged.worker._obj_bytes[0] > 0
    staged.worker.shutdown()


@pytest.mark.parametrize("name", ["BLHNC", "BLNHC", "BHLNC"])
def test_declared_page_first_layout_refused_by_name(rdma_members, tenant, name):
    """vLLM's resolved layout (cache_config.kv_cache_layout, what its NIXL connector reads as
    a packed cache): a block-outermost one refuses direct mode when the connector is built, for
    both roles; layer-first ones and the host-staging path are unaffected."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

    from engine_support import vllm_configs

    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        cfg, kvc = vllm_configs(rdma_members, tenant, direct_gpu=True)
        cfg.cache_config.kv_cache_layout = name
        with pytest.raises(ValueError, match=f"direct_gpu does not serve page-first KV cache layouts: vLLM's "
                                             f"KV cache layout is {name} \\(block-outermost"):
            KVConnectorFactory.create_connector(cfg, role, kvc)
    for direct, layout in ((False, name), (True, "LBNHC"), (True, "LHBNC")):
        cfg, kvc = vllm_configs(rdma_members, tenant, direct_gpu=direct)
        cfg.cache_config.kv_cache_layout = layout
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kvc).shutdown()


@pytest.mark.parametrize("why", ["nic-refuses", "client-without-rdma"])
def test_refused_dmabuf_registration_refuses_direct_mode_at_start(rdma_members, tenant, rdma_env, monkeypatch, why):
    """The client refuses the DMA-BUF (dfkv.DirectUnsupported): direct mode refuses at
    register_kv_caches with the library's reason (the driver's errno text) instead of starting
    and failing every load, and leaves nothing registered or open behind. "nic-refuses": the
    exporter hands over an fd the (soft) NIC cannot import (/dev/null: its mmap answers ENODEV,
    as rxe's ibv_reg_dmabuf_mr answers EOPNOTSUPP); "client-without-rdma": DFKV_RDMA=0."""
    import dfkv

    caches = DevCaches()
    given = []
    if why == "client-without-rdma":
        monkeypatch.setenv("DFKV_RDMA", "0")

    def make(rank, worker, shapes):
        got = caches(rank, worker, shapes)
        if why == "nic-refuses":
            inner = worker.dmabuf_exporter

            def export(ptr, size, tensor):
                fd, off = inner(ptr, size, tensor)
                os.close(fd)
                fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                given.append((fd, os.fstat(fd)))
                return fd, off

            worker.dmabuf_exporter = export
        return got

    with pytest.raises(RuntimeError) as ei:
        VllmEngine(rdma_members, tenant, make_caches=make, direct_gpu=True)
    msg = str(ei.value)
    print(msg)
    assert isinstance(ei.value.__cause__, dfkv.DirectUnsupported), repr(ei.value.__cause__)
    assert "direct_gpu: the RDMA NIC (or the client: no RDMA) refused to register the KV cache memory" in msg
    assert "DirectUnsupported" in msg and "use the host-staging path (direct_gpu: false)" in msg.lower()
    if why == "nic-refuses":
        assert "no such device" in msg  # ENODEV, the errno the soft NIC's mmap got
        assert len(given) == 1
        fd, st = given[0]
        try:  # the connector closed the fd it was given (the number may be reused since)
            assert not os.path.samestat(os.fstat(fd), st), "the refused DMA-BUF fd is still open"
        except OSError:
            pass
    else:
        assert "the client has no RDMA" in msg


def test_default_exporter_refuses_non_cuda_memory_by_name():
    """Without an injected seam, direct_gpu needs CUDA KV caches: a CPU tensor is refused
    with the device it lives on (never a silent host path)."""
    from dfkv.connectors.vllm_v1 import export_cuda_dmabuf

    t = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(ValueError, match="lives on cpu, not on a CUDA device"):
        export_cuda_dmabuf(t.data_ptr(), t.numel(), t)


def test_block_runs_match_the_staging_byte_order():
    """The runs a direct load scatters into are, concatenated, exactly the bytes the staging
    path copies for a block (index_select + movedim + reshape), for split, contiguous and a
    strided head-major view."""
    from dfkv.connectors.vllm_v1 import _block_runs

    phys = torch.arange(2 * 16 * 4 * 2 * 8, dtype=torch.int16)
    views = {
        "split": (phys.view(2, 16, 4, 2, 8), 1),
        "contiguous": (phys.view(16, 2, 4, 2, 8), 0),
        "hnd": (phys.view(16, 2, 2, 4, 8).permute(1, 0, 3, 2, 4), 1),  # (2, nb, bs, H, D), heads outer
    }
    raw = phys.view(torch.uint8)
    for name, (t, bdim) in views.items():
        runs = _block_runs(t, bdim)
        for b in (0, 5, 15):
            base = (t.data_ptr() - phys.data_ptr()) + b * t.stride(bdim) * t.element_size()
            got = torch.cat([raw[base + o: base + o + n] for o, n in runs])
            want = t.select(bdim, b).contiguous().view(-1).view(torch.uint8)
            assert torch.equal(got, want), (name, b, runs)
    assert len(_block_runs(*views["contiguous"])) == 1 and len(_block_runs(*views["split"])) == 2
