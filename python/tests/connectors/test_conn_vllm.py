"""vLLM KV connector against the real vLLM package, libdfkv.so and dfkv_server.

Path taken: real ``vllm`` (0.33.0, installed with --no-deps by tools/test.sh): ``VllmConfig``
(CPU device) with a real ``KVTransferConfig`` (kv_connector + kv_connector_module_path),
``KVCacheConfig`` / ``FullAttentionSpec``, vLLM's ``KVConnectorFactory.create_connector`` for
both roles, real ``Request`` objects with vLLM's own block hasher, ``KVCacheBlocks``,
``NewRequestData`` and ``SchedulerOutput``. The paged KV tensors are CPU tensors in
FlashAttention's layout. No vLLM code is copied.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.factory",
                    reason="vllm is not installed (tools/test.sh installs vllm==0.33.0 --no-deps)")

import torch  # noqa: E402
from engine_support import (  # noqa: E402
    VLLM_BLOCK,
    block_digest,
    run_engine_script,
    vllm_blocks,
    vllm_connectors,
    vllm_request,
    vllm_match,
    vllm_step,
)

pytestmark = pytest.mark.server

PROMPT = list(range(100, 114))  # 14 tokens: 3 full blocks of 4 can be hit (1 token recomputed)


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def _fill(caches, seed):
    g = torch.Generator().manual_seed(seed)
    for t in caches.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))


def _prefill_and_save(members, tenant, block_ids, seed=1):
    sched, worker, caches = vllm_connectors(members, tenant)
    _fill(caches, seed)
    req = vllm_request("writer", PROMPT)
    assert vllm_match(sched, req, 0) == (0, False)
    sched.update_state_after_alloc(req, vllm_blocks(block_ids), 0)
    meta = vllm_step(sched, worker, [req], {"writer": block_ids})
    assert [x.n_units for x in meta.saves] == [3] and not meta.loads
    return sched, worker, caches


def test_factory_builds_hma_connector(members, tenant):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, supports_hma

    sched, worker, _ = vllm_connectors(members, tenant)
    assert isinstance(sched, KVConnectorBase_V1) and supports_hma(sched)
    assert type(sched).__module__ == "dfkv.connectors.vllm_v1"
    cls = KVConnectorFactory.get_connector_class(sched._vllm_config.kv_transfer_config)
    assert cls is type(sched)
    assert sched.request_finished_all_groups(vllm_request("x", PROMPT), ([1],)) == (False, None)


def test_prefix_hit_across_processes(members, tenant):
    ids = [3, 4, 5, 6]
    _, _, caches = _prefill_and_save(members, tenant, ids)
    want = block_digest(caches, ids[:3])
    r = run_engine_script(f"""
        import json
        from engine_support import *
        sched, worker, caches = vllm_connectors({members!r}, {tenant!r})
        req = vllm_request("reader", {PROMPT!r})
        n, is_async = vllm_match(sched, req, 0)
        ids = [9, 10, 11, 12]
        sched.update_state_after_alloc(req, vllm_blocks(ids), n)
        req.num_computed_tokens = n
        meta = vllm_step(sched, worker, [req], {{"reader": ids}})
        print(json.dumps({{"n": n, "async": is_async, "loads": [x.n_units for x in meta.loads],
                           "saves": [x.n_units for x in meta.saves],
                           "loaded": worker.loaded_last,
                           "digest": block_digest(caches, ids[:3]),
                           "untouched": bool((caches[VLLM_LAYERS[0]][:, 12] == 0).all())}}))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 3 * VLLM_BLOCK and out["async"] is True
    assert out["loads"] == [3] and out["saves"] == [] and out["loaded"] == {"reader": 3}
    assert out["digest"] == want and out["untouched"]


def test_partial_local_hit_loads_only_the_rest(members, tenant):
    _prefill_and_save(members, tenant, [3, 4, 5, 6])
    sched, worker, caches = vllm_connectors(members, tenant)
    req = vllm_request("r", PROMPT)
    assert vllm_match(sched, req, VLLM_BLOCK) == (2 * VLLM_BLOCK, True)
    assert vllm_match(sched, req, 3 * VLLM_BLOCK) == (0, False)


def test_short_load_reports_the_prefix_without_writing_the_rest(members, tenant):
    import dfkv

    _, writer, _ = _prefill_and_save(members, tenant, [3, 4, 5, 6], seed=5)
    sched, worker, caches = vllm_connectors(members, tenant)
    req = vllm_request("r", PROMPT)
    n, _ = vllm_match(sched, req, 0)
    assert n == 3 * VLLM_BLOCK
    # Between lookup and load, block 1's object becomes short and block 2's disappears.
    hashes = [bytes(h) for h in req.block_hashes]
    with dfkv.Client(members, namespace=worker._client.namespace) as c:
        assert c.put(worker._key(hashes[1], 0, 0, 0), b"short")
        assert c.remove(worker._key(hashes[2], 0, 0, 0))
    for t in caches.values():
        t.fill_(7)
    ids = [9, 10, 11, 12]
    sched.update_state_after_alloc(req, vllm_blocks(ids), n)
    req.num_computed_tokens = n
    vllm_step(sched, worker, [req], {"r": ids})
    assert worker.loaded_last == {"r": 1}  # only block 0 arrived whole: vLLM recomputes 1..2
    assert worker.get_block_ids_with_load_errors() == set()  # never the failing policy's path
    for t in caches.values():
        assert (t[:, 10] == 7).all() and (t[:, 11] == 7).all()  # not corrupted
        assert not (t[:, 9] == 7).all()  # block 0 arrived


def test_mla_rank0_writes_one_shared_object(members, tenant):
    s0, w0, c0 = vllm_connectors(members, tenant, use_mla=True, tp_rank=0)
    s1, w1, c1 = vllm_connectors(members, tenant, use_mla=True, tp_rank=1)
    assert w0._key(b"h", 0, 0, 0) == w1._key(b"h", 0, 1, 0)  # no TP suffix
    _fill(c0, 3)
    _fill(c1, 4)
    ids = [3, 4, 5, 6]
    req = vllm_request("w", PROMPT)
    vllm_match(s1, req, 0)
    s1.update_state_after_alloc(req, vllm_blocks(ids), 0)
    vllm_step(s1, w1, [req], {"w": ids})  # rank 1: plans saves, writes nothing
    assert vllm_match(s0, vllm_request("q", PROMPT), 0) == (0, False)
    req = vllm_request("w0", PROMPT)
    vllm_match(s0, req, 0)
    s0.update_state_after_alloc(req, vllm_blocks(ids), 0)
    vllm_step(s0, w0, [req], {"w0": ids})
    assert vllm_match(s1, vllm_request("q", PROMPT), 0) == (3 * VLLM_BLOCK, True)


def test_dead_node_is_misses_fast(tenant):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    sched, worker, caches = vllm_connectors(f"n1=127.0.0.1:{port}", tenant)
    req = vllm_request("r", PROMPT)
    assert vllm_match(sched, req, 0) == (0, False)
    for t in caches.values():
        t.fill_(1)
    # a plan that claims a hit (as if the node died after the lookup): nothing arrives
    from dfkv.connectors.vllm_v1 import _Lookup

    sched._lookups["r"] = _Lookup(0, hits=3)
    sched.update_state_after_alloc(req, vllm_blocks([2, 3, 4, 5]), 3 * VLLM_BLOCK)
    req.num_computed_tokens = 3 * VLLM_BLOCK
    vllm_step(sched, worker, [req], {"r": [2, 3, 4, 5]})  # load fails, save is dropped
    assert worker.loaded_last == {"r": 0}
    assert all((t == 1).all() for t in caches.values())
    assert time.monotonic() - t0 < 30


def _kernel_split_caches():
    # vLLM 0.33 [B, H, N, C] views with a kernel split of 2: B = num_blocks x 2 kernel blocks
    # of VLLM_BLOCK/2 tokens, a block's kernel blocks in consecutive rows
    from engine_support import VLLM_HEAD, VLLM_HEADS, VLLM_LAYERS, VLLM_NUM_BLOCKS

    return {n: torch.zeros(VLLM_NUM_BLOCKS * 2, 2 * VLLM_HEADS, VLLM_BLOCK // 2, VLLM_HEAD, dtype=torch.bfloat16)
            for n in VLLM_LAYERS}


def test_kernel_split_views_and_raw_buffers_round_trip(members, tenant):
    from engine_support import VLLM_LAYERS, VLLM_NUM_BLOCKS

    for make in (_kernel_split_caches,
                 lambda: {n: torch.zeros(VLLM_NUM_BLOCKS * 512, dtype=torch.uint8) for n in VLLM_LAYERS}):
        t = "t-" + uuid.uuid4().hex[:12]
        sched, worker, _ = vllm_connectors(members, t)
        caches = make()
        worker.register_kv_caches(caches)
        g = torch.Generator().manual_seed(9)
        for c in caches.values():
            c.copy_(torch.randint(0, 255, c.shape, generator=g).to(c.dtype))
        req = vllm_request("w", PROMPT)
        vllm_match(sched, req, 0)
        sched.update_state_after_alloc(req, vllm_blocks([3, 4, 5, 6]), 0)
        vllm_step(sched, worker, [req], {"w": [3, 4, 5, 6]})
        rs, rw, _ = vllm_connectors(members, t)
        back = make()
        rw.register_kv_caches(back)
        req = vllm_request("r", PROMPT)
        n, _ = vllm_match(rs, req, 0)
        assert n == 3 * VLLM_BLOCK
        rs.update_state_after_alloc(req, vllm_blocks([9, 10, 11, 12]), n)
        req.num_computed_tokens = n
        vllm_step(rs, rw, [req], {"r": [9, 10, 11, 12]})
        assert rw.loaded_last == {"r": 3}
        for name in caches:
            a = caches[name].view(VLLM_NUM_BLOCKS, -1)
            b = back[name].view(VLLM_NUM_BLOCKS, -1)
            assert torch.equal(a[3:6], b[9:12])  # block by block, every kernel block
            assert not b[12].any()


def test_unknown_layout_refuses_at_start(members, tenant):
    _, worker, _ = vllm_connectors(members, tenant)
    with pytest.raises(ValueError, match=r"layer .*shape \(7, 5\).*not supported"):
        worker.register_kv_caches({"model.layers.0.self_attn.attn": torch.zeros(7, 5)})


@pytest.fixture(scope="module")
def rdma_members(tmp_path_factory):
    """A dfkv_server with RDMA over the soft provider (the software NIC)."""
    from conftest import _run_server

    for addr in _run_server(tmp_path_factory, "dfkv_server_rdma", "--rdma", "--rdma-provider", "soft"):
        yield f"n1={addr}"


def test_rdma_moves_blocks_through_the_registered_host_buffers(rdma_members, tenant):
    """With DFKV_RDMA=1 the worker's host staging buffers (registered once with
    dfkv_register_memory) are what RDMA v2 reads and writes: pool-MR ops only, no ad-hoc
    registration, no staging copy; a second connector loads the same bytes."""
    r = run_engine_script(f"""
        import json
        from engine_support import *
        import torch

        def stat(c, name):
            for line in c.stats_snapshot().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            raise AssertionError(name + " missing")

        sched, worker, caches = vllm_connectors({rdma_members!r}, {tenant!r})
        g = torch.Generator().manual_seed(5)
        for t in caches.values():
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
        req = vllm_request("writer", {PROMPT!r})
        vllm_match(sched, req, 0)
        sched.update_state_after_alloc(req, vllm_blocks([3, 4, 5, 6]), 0)
        vllm_step(sched, worker, [req], {{"writer": [3, 4, 5, 6]}})
        want = block_digest(caches, [3, 4, 5])
        wc = worker._client.get()

        sched2, worker2, caches2 = vllm_connectors({rdma_members!r}, {tenant!r})
        req = vllm_request("reader", {PROMPT!r})
        n, _ = vllm_match(sched2, req, 0)
        sched2.update_state_after_alloc(req, vllm_blocks([9, 10, 11, 12]), n)
        req.num_computed_tokens = n
        vllm_step(sched2, worker2, [req], {{"reader": [9, 10, 11, 12]}})
        rc = worker2._client.get()
        names = ["dfkv_rdma_mr_pool_ops_total", "dfkv_rdma_mr_adhoc_registrations_total",
                 "dfkv_rdma_staged_ops_total", "dfkv_rdma_v2_put_writes_total"]
        out = {{"n": n, "loaded": worker2.loaded_last, "same": block_digest(caches2, [9, 10, 11]) == want,
               "modes": [wc.transport_mode, rc.transport_mode],
               "writer": {{k: stat(wc, k) for k in names}}, "reader": {{k: stat(rc, k) for k in names}},
               "regs": [stat(wc, "dfkv_rdma_mr_pool_registrations_total"), stat(rc, "dfkv_rdma_mr_pool_registrations_total")]}}
        # shutdown unregisters the host buffers (each once, successfully) before closing
        unreg = []
        for w, c in ((worker, wc), (worker2, rc)):
            orig = c.unregister_memory
            c.unregister_memory = lambda *a, orig=orig: unreg.append(orig(*a)) or unreg[-1]
            w.shutdown()
        out["unreg"] = unreg
        print(json.dumps(out))
    """, env={"DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": "soft"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 3 * VLLM_BLOCK and out["loaded"] == {"reader": 3} and out["same"], out
    assert out["modes"] == ["rdma", "rdma"], out
    w, rd = out["writer"], out["reader"]
    assert w["dfkv_rdma_v2_put_writes_total"] == 3 and w["dfkv_rdma_mr_pool_ops_total"] == 3, out
    assert rd["dfkv_rdma_mr_pool_ops_total"] == 3, out
    assert out["regs"][0] >= 1 and out["regs"][1] >= 1, out
    assert out["unreg"] == [True] * int(sum(out["regs"])), out
    for side in (w, rd):
        assert side["dfkv_rdma_mr_adhoc_registrations_total"] == 0 and side["dfkv_rdma_staged_ops_total"] == 0, out


@pytest.fixture(scope="module")
def events_node(tmp_path_factory):
    """A dfkv_server publishing KV events: (members, PUB endpoint)."""
    import socket

    from conftest import _run_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        pub = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    for addr in _run_server(tmp_path_factory, "dfkv_server_events", "--kv-events", pub):
        yield f"n1={addr}", pub


def test_saved_blocks_publish_vllm_block_hashes(events_node, tenant):
    """The connector tags what it stores with vLLM's block hash: the node's KV events,
    decoded with vLLM's own classes, name the saved blocks' hashes and the model."""
    import msgspec
    import zmq
    from vllm.distributed import kv_events
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    members, pub = events_node
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub)
        time.sleep(0.5)  # the subscription reaches the publisher
        sched, _, _ = _prefill_and_save(members, tenant, [3, 4, 5, 6])
        want = {maybe_convert_block_hash(h) for h in vllm_request("writer", PROMPT).block_hashes[:3]}
        dec = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
        got, topics = set(), set()
        deadline = time.monotonic() + 15
        while got != want and time.monotonic() < deadline:
            if sub.poll(200):
                topic, _, payload = sub.recv_multipart()
                for ev in dec.decode(payload).events:
                    # Only the saved blocks' events count: the node publishes for whatever
                    # else is stored on it too (an earlier test's late events, untagged-model
                    # values under an empty label), which says nothing about this connector.
                    if isinstance(ev, kv_events.BlockStored) and want & set(ev.block_hashes):
                        got.update(ev.block_hashes)
                        topics.add(topic.decode())
        assert got == want
        assert all(t.endswith("@" + sched.model_label) for t in topics), topics
    finally:
        ctx.destroy(linger=0)
