"""SGLang HiCache backend against the real SGLang package, libdfkv.so and dfkv_server.

Path taken: real ``sglang`` (0.5.23, installed with --no-deps by tools/test.sh) for
``HiCacheStorage``, ``HiCacheStorageConfig``, ``StorageBackendFactory`` (dynamic loading by
module_path/class_name, ``cls(storage_config, kwargs)``) and the v2 ``PoolTransfer`` types;
the host KV pool is the page-address mirror in engine_support.py (see its docstring).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory",
                    reason="sglang is not installed (tools/test.sh installs sglang==0.5.23 --no-deps)")

import torch  # noqa: E402
from engine_support import (  # noqa: E402
    EventSubscriber,
    MirrorMHAHostPool,
    MirrorMLAHostPool,
    events_server,
    page_keys,
    run_engine_script,
    sglang_backend,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

pytestmark = pytest.mark.server


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


class _Spy:
    """Wraps the client's CDLL: records every ABI call and the scatter-gather segments."""

    def __init__(self, lib):
        self._lib = lib
        self.names = []
        self.sg = []  # (name, [[(ptr, len), ...] per item])

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.startswith("dfkv_"):
            return fn

        def wrapped(*args):
            self.names.append(name)
            if name in ("dfkv_batch_put_sg", "dfkv_batch_get_auto_sg"):
                _, _, _, sp, sl, sc, n = args[:7]
                self.sg.append((name, [[(sp[i][j], sl[i][j]) for j in range(sc[i])] for i in range(n)]))
            return fn(*args)

        return wrapped


def _spy(backend) -> _Spy:
    backend.batch_exists(["warm-up"])  # opens the client lazily
    c = backend.client
    assert c is not None
    spy = _Spy(c._lib)
    c._lib = spy
    return spy


def test_factory_loads_real_subclass(members, tenant):
    pool = MirrorMHAHostPool(2, 2, 8, 4, 64)
    b = sglang_backend(members, tenant, pool)
    assert isinstance(b, HiCacheStorage) and type(b).__name__ == "DfkvHiCacheStorage"
    assert type(b).__module__ == "dfkv.connectors.sglang_hicache"
    b.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_zero_copy_roundtrip_across_processes(members, tenant, layout):
    pool = MirrorMHAHostPool(layer_num=3, head_num=2, head_dim=16, page_size=4, size=64, layout=layout)
    pool.fill(7)
    b = sglang_backend(members, tenant, pool)
    spy = _spy(b)
    keys = page_keys(tenant, 5)
    idx = torch.arange(8, 28)  # pages 2..6 of the host pool
    assert b.batch_set_v1(keys, idx) == [True] * 5

    # Zero copy: the segments handed to dfkv_batch_put_sg are the host pool's own page
    # addresses (get_page_buffer_meta), K and V (every layer's, layer-first) of a page
    # gathered into one object; no other data call was made.
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    (name, items), = spy.sg
    assert name == "dfkv_batch_put_sg" and len(items) == 5
    per = len(ptrs) // 5
    assert per == (2 if layout == "page_first" else 2 * 3)
    assert [seg for item in items for seg in item] == list(zip(ptrs, sizes))
    lo = pool.kv_buffer.data_ptr()
    hi = lo + pool.kv_buffer.numel() * pool.kv_buffer.element_size()
    assert all(lo <= p and p + n <= hi for item in items for p, n in item)
    assert "dfkv_batch_put" not in spy.names and "dfkv_put" not in spy.names
    want = {k: hashlib.sha256(pool.page_bytes(p)).hexdigest() for k, p in zip(keys, range(2, 7))}
    b.close()

    # A second instance in another process (an engine restart) finds the prefix and reads
    # the bytes back, zero-copy, into its own pool at other slots.
    r = run_engine_script(f"""
        import hashlib, json, torch
        from engine_support import MirrorMHAHostPool, sglang_backend
        pool = MirrorMHAHostPool(3, 2, 16, 4, 64, layout={layout!r})
        b = sglang_backend({members!r}, {tenant!r}, pool)
        keys = {keys!r}
        n = b.batch_exists(keys + ["absent-page"])
        res = b.batch_get_v1(keys, torch.arange(40, 60))
        print(json.dumps({{"exists": n, "get": res,
                           "digests": {{k: hashlib.sha256(pool.page_bytes(10 + i)).hexdigest()
                                        for i, k in enumerate(keys)}}}}))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["exists"] == 5 and out["get"] == [True] * 5
    assert out["digests"] == want


def test_zero_copy_get_lands_in_pool_memory(members, tenant):
    pool = MirrorMHAHostPool(2, 2, 8, 4, 32)
    pool.fill(3)
    b = sglang_backend(members, tenant, pool)
    keys = page_keys(tenant, 2)
    assert b.batch_set_v1(keys, torch.arange(0, 8)) == [True, True]
    want = [pool.page_bytes(0), pool.page_bytes(1)]
    spy = _spy(b)
    idx = torch.arange(16, 24)
    assert b.batch_get_v1(keys, idx) == [True, True]
    (name, items), = spy.sg
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    assert name == "dfkv_batch_get_auto_sg"
    assert [seg for item in items for seg in item] == list(zip(ptrs, sizes))
    assert [pool.page_bytes(4), pool.page_bytes(5)] == want
    b.close()


def test_batch_exists_counts_consecutive_hits(members, tenant):
    pool = MirrorMHAHostPool(2, 2, 8, 4, 32)
    b = sglang_backend(members, tenant, pool)
    k = page_keys(tenant, 4)
    assert b.batch_set_v1([k[0], k[1], k[3]], torch.arange(0, 12)) == [True] * 3
    assert b.batch_exists(k) == 2
    assert b.batch_exists([k[3]]) == 1 and b.exists(k[0]) and not b.exists(k[2])
    assert b.batch_exists([]) == 0
    b.close()


def test_mla_one_shared_object_per_page_rank0_writes(members, tenant):
    pools = [MirrorMLAHostPool(2, 16, 8, 4, 32) for _ in range(2)]
    pools[0].fill(11)
    pools[1].fill(99)
    b0 = sglang_backend(members, tenant, pools[0], tp_rank=0, tp_size=2, mla=True)
    b1 = sglang_backend(members, tenant, pools[1], tp_rank=1, tp_size=2, mla=True)
    assert not b1.is_writer and b0.is_writer
    keys = page_keys(tenant, 2)
    idx = torch.arange(0, 8)
    assert b1.batch_set_v1(keys, idx) == [True, True]  # skipped: rank 1 never writes
    assert b0.batch_exists(keys) == 0
    spy = _spy(b0)
    assert b0.batch_set_v1(keys, idx) == [True, True]
    (_, items), = spy.sg
    assert all(len(item) == 1 for item in items)  # one latent segment per page
    # rank 1 reads rank 0's object: same key, no TP suffix
    assert b1.batch_exists(keys) == 2
    assert b1.batch_get_v1(keys, torch.arange(8, 16)) == [True, True]
    assert torch.equal(pools[1].kv_buffer[8:16], pools[0].kv_buffer[0:8])
    b0.close()
    b1.close()


def test_generic_get_set_with_tensors(members, tenant):
    pool = MirrorMHAHostPool(2, 2, 8, 4, 32)
    b = sglang_backend(members, tenant, pool, extra={"interface_v1": 0})
    keys = page_keys(tenant, 3)
    values = [torch.randn(256, dtype=torch.float32) for _ in keys]
    assert b.batch_set(keys, values) is True
    assert b.set("single-" + tenant, torch.arange(64, dtype=torch.int32)) is True
    targets = [torch.empty(256, dtype=torch.float32) for _ in keys]
    got = b.batch_get(keys + ["missing"], targets + [torch.empty(256)])
    assert got[:3] == targets and got[3] is None
    assert all(torch.equal(a, v) for a, v in zip(targets, values))
    t = torch.empty(64, dtype=torch.int32)
    assert b.get("single-" + tenant, t) is t and torch.equal(t, torch.arange(64, dtype=torch.int32))
    assert b.get("single-" + tenant, torch.empty(65, dtype=torch.int32)) is None  # wrong size
    b.close()


def test_short_or_oversized_value_is_a_miss(members, tenant):
    import dfkv

    pool = MirrorMHAHostPool(2, 2, 8, 4, 32)
    pool.fill(5)
    b = sglang_backend(members, tenant, pool)
    keys = page_keys(tenant, 3)
    assert b.batch_exists(keys) == 0
    geom = b._geoms["kv"]
    with dfkv.Client(members, namespace=b.client.namespace) as c:
        assert c.put(geom.key(keys[0]), b"x" * 100)  # short
        assert c.put(geom.key(keys[1]), b"y" * (geom.page_bytes + 1))  # too long
    assert b.batch_get_v1(keys[:2], torch.arange(0, 8)) == [False, False]
    assert b.batch_exists(keys) == 2  # present, yet unusable: the get reports the miss
    b.close()


def test_v2_multi_pool(members, tenant):
    kv = MirrorMHAHostPool(2, 2, 8, 4, 64)
    swa = MirrorMHAHostPool(1, 1, 8, 4, 64)
    kv.fill(1)
    swa.fill(2)
    b = sglang_backend(members, tenant, kv)
    b.register_mem_host_pool_v2(swa, PoolName.SWA)
    keys = page_keys(tenant, 4)
    idx = torch.arange(0, 16)
    res = b.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=idx, keys=keys),
                          PoolTransfer(name=PoolName.SWA, host_indices=idx[12:], keys=keys[3:])])
    assert res[PoolName.KV] == [True] * 4 and res[PoolName.SWA] == [True]
    # SWA keeps only the trailing page of each prefix: prefix 4 is restorable, 1..3 are not
    r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys[3:],
                                              hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert isinstance(r, PoolTransferResult)
    assert r.kv_hit_pages == 4 and r.restorable_prefix_pages == [4]
    assert r.extra_pool_hit_pages[PoolName.SWA] == 4
    r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys,
                                              hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
    kv2 = MirrorMHAHostPool(2, 2, 8, 4, 64)
    swa2 = MirrorMHAHostPool(1, 1, 8, 4, 64)
    b2 = sglang_backend(members, tenant, kv2)
    b2.register_mem_host_pool_v2(swa2, PoolName.SWA)
    got = b2.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=idx, keys=keys),
                           PoolTransfer(name=PoolName.SWA, host_indices=idx[12:], keys=keys[3:])])
    assert got == {PoolName.KV: [True] * 4, PoolName.SWA: [True]}
    assert torch.equal(kv2.kv_buffer[:, :16], kv.kv_buffer[:, :16]) and torch.equal(swa2.kv_buffer[:, 12:16], swa.kv_buffer[:, 12:16])
    b.close()
    b2.close()


def test_dead_node_is_misses_fast(tenant):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    pool = MirrorMHAHostPool(2, 2, 8, 4, 32)
    b = sglang_backend(f"n1=127.0.0.1:{port}", tenant, pool)
    keys = page_keys(tenant, 3)
    t0 = time.monotonic()
    assert b.batch_exists(keys) == 0 and b.exists(keys[0]) is False
    assert b.batch_set_v1(keys, torch.arange(0, 12)) == [False] * 3
    assert b.batch_get_v1(keys, torch.arange(0, 12)) == [False] * 3
    assert b.batch_get(keys, [torch.empty(4) for _ in keys]) == [None] * 3
    assert b.batch_set(keys, [torch.empty(4) for _ in keys]) is False
    r = b.batch_exists_v2(keys, [])
    assert r.kv_hit_pages == 0
    assert b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=torch.arange(0, 12), keys=keys)]) == {PoolName.KV: [False] * 3}
    assert time.monotonic() - t0 < 15
    # arguments the engine should never send still give lists, not exceptions
    assert b.batch_get_v1(keys, torch.arange(0, 5)) == [False] * 3
    b.close()


def test_unconfigured_backend_refuses_loudly(monkeypatch):
    monkeypatch.delenv("DFKV_MEMBERS", raising=False)
    monkeypatch.delenv("DFKV_MDS", raising=False)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    sc = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                              is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                              model_name="m", extra_config={"backend_name": "dfkv",
                                                            "module_path": "dfkv.connectors.sglang_hicache",
                                                            "class_name": "DfkvHiCacheStorage"})
    with pytest.raises(ValueError, match="no dfkv nodes configured"):
        StorageBackendFactory.create_backend("dynamic", sc, None)



@pytest.fixture(scope="module")
def rdma_members(tmp_path_factory):
    """A dfkv_server with RDMA over the soft provider (the software NIC)."""
    from conftest import _run_server

    for addr in _run_server(tmp_path_factory, "dfkv_server_rdma", "--rdma", "--rdma-provider", "soft"):
        yield f"n1={addr}"


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_rdma_moves_pages_through_the_registered_host_pool(rdma_members, tenant, layout):
    """With DFKV_RDMA=1 the backend registers the host pool with dfkv_register_memory once,
    and every page moves over RDMA v2 straight from and into it: pool-MR ops only, no ad-hoc
    registration, no staging copy; the bytes read back into other slots are the pages'."""
    r = run_engine_script(f"""
        import hashlib, json, torch
        from engine_support import MirrorMHAHostPool, page_keys, sglang_backend

        def stat(c, name):
            for line in c.stats_snapshot().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            raise AssertionError(name + " missing")

        pool = MirrorMHAHostPool(layer_num=2, head_num=2, head_dim=64, page_size=16, size=256, layout={layout!r})
        pool.fill(11)
        b = sglang_backend({rdma_members!r}, {tenant!r}, pool)
        keys = page_keys({tenant!r}, 6)
        put = b.batch_set_v1(keys, torch.arange(16, 16 + 6 * 16))
        want = [hashlib.sha256(pool.page_bytes(1 + i)).hexdigest() for i in range(6)]
        got = b.batch_get_v1(keys, torch.arange(128, 128 + 6 * 16))
        have = [hashlib.sha256(pool.page_bytes(8 + i)).hexdigest() for i in range(6)]
        c = b.client
        names = ["dfkv_rdma_mr_pool_ops_total", "dfkv_rdma_mr_adhoc_registrations_total",
                 "dfkv_rdma_staged_ops_total", "dfkv_rdma_v2_put_writes_total", "dfkv_rdma_completion_errors_total"]
        out = {{"put": put, "get": got, "same": want == have, "mode": c.transport_mode,
               **{{n: stat(c, n) for n in names + ["dfkv_rdma_mr_pool_registrations_total"]}}}}
        # close unregisters the host pool's buffers (each once, successfully) first
        unreg = []
        orig = c.unregister_memory
        c.unregister_memory = lambda *a: unreg.append(orig(*a)) or unreg[-1]
        b.close()
        out["unreg"] = unreg
        print(json.dumps(out))
    """, env={"DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": "soft"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["put"] == [True] * 6 and out["get"] == [True] * 6 and out["same"], out
    assert out["mode"] == "rdma", out
    assert out["dfkv_rdma_v2_put_writes_total"] == 6 and out["dfkv_rdma_completion_errors_total"] == 0, out
    assert out["dfkv_rdma_mr_pool_ops_total"] == 12, out  # 6 puts + 6 gets, all in the pool
    assert out["dfkv_rdma_mr_adhoc_registrations_total"] == 0 and out["dfkv_rdma_staged_ops_total"] == 0, out
    assert out["dfkv_rdma_mr_pool_registrations_total"] >= 1, out
    assert out["unreg"] == [True] * int(out["dfkv_rdma_mr_pool_registrations_total"]), out


@pytest.fixture(scope="module")
def events_node(tmp_path_factory):
    """A dfkv_server publishing KV events: (members, PUB endpoint)."""
    yield from events_server(tmp_path_factory, "dfkv_server_sglang_events")


@pytest.mark.parametrize("interface_v1", [1, 0])
def test_stored_pages_publish_sglang_block_hashes(events_node, tenant, interface_v1):
    """The backend tags every page it stores with the hash SGLang's own KV events carry
    (``hash_str_to_int64`` of the page hash, chained by parent) and the model: the node's
    events, decoded with SGLang's own classes, name exactly those pages, on the model's topic."""
    from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    members, pub = events_node
    pool = MirrorMHAHostPool(2, 2, 8, 4, 64)
    pool.fill(3)
    b = sglang_backend(members, tenant, pool, extra={"interface_v1": interface_v1})
    keys = page_keys(tenant, 4)
    want = [hash_str_to_int64(k) for k in keys]
    with EventSubscriber(pub, KVEventBatch) as sub:
        if interface_v1:
            assert b.batch_set_v1(keys, torch.arange(8, 24)) == [True] * 4
        else:
            assert b.batch_set(keys, [torch.randn(256) for _ in keys]) is True
        got = sub.collect(lambda ev: isinstance(ev, BlockStored) and set(ev.block_hashes) & set(want),
                          lambda got: len(got) >= len(want))
    b.close()
    by_hash = {ev.block_hashes[0]: (topic, ev) for topic, ev in got}
    assert sorted(by_hash) == sorted(want), got
    for i, h in enumerate(want):
        topic, ev = by_hash[h]
        assert ev.parent_block_hash == (want[i - 1] if i else None), ev
        assert ev.block_size == 4 and topic.endswith("@dfkv-test/tiny-model"), (topic, ev)
