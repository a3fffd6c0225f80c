"""The vLLM connector under vLLM's own Scheduler (vllm 0.33.0, CPU, no model).

``engine_support.VllmEngine`` builds the real ``Scheduler`` from a ``VllmConfig`` whose
``kv_transfer_config`` names the dfkv connector (vLLM's ``KVConnectorFactory`` loads it), and
steps it as vLLM's engine core does; only the model is missing: a fake forward writes each
computed block's KV as a pure function of its block hash, so loaded bytes are checked exactly.
The ModelConfig is a stand-in (``NoModelConfig``): building the real one needs a model's HF
config. The dfkv side is the real libdfkv.so and dfkv_server.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("vllm.v1.core.sched.scheduler", reason="vllm is not installed (tools/test.sh installs vllm==0.33.0 --no-deps)")

from engine_support import VLLM_BLOCK, VllmEngine, vllm_request  # noqa: E402

pytestmark = pytest.mark.server

PROMPT = list(range(200, 214))  # 14 tokens: 3 full blocks of 4 can come from dfkv


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def _write(members, tenant, **kw):
    w = VllmEngine(members, tenant, **kw)
    w.add(vllm_request("writer", PROMPT))
    w.run(["writer"])
    assert w.computed_by_forward["writer"] == len(PROMPT)
    return w


@pytest.mark.parametrize("groups", [1, 2], ids=["one-group", "hma"])
def test_lookup_async_load_finish(members, tenant, groups):
    _write(members, tenant, groups=groups)
    r = VllmEngine(members, tenant, groups=groups)
    r.add(vllm_request("reader", PROMPT))
    so = r.step()  # the lookup is in flight: vLLM skips the request this step
    assert so.num_scheduled_tokens == {}
    r.settle()
    r.run(["reader"])
    before, intact = r.first_forward["reader"]
    assert before == 3 * VLLM_BLOCK and intact  # three blocks loaded, byte-exact
    assert r.computed_by_forward["reader"] == len(PROMPT) - 3 * VLLM_BLOCK
    assert r.finished["reader"].finish_reason is not None
    assert str(r.finished["reader"].finish_reason) != "FinishReason.ERROR"


@pytest.mark.parametrize("groups,policy", [(1, None), (2, None), (1, "recompute")],
                         ids=["default-policy", "hma-default-policy", "recompute-policy"])
def test_object_gone_between_lookup_and_load_recomputes(members, tenant, groups, policy):
    import dfkv

    w = _write(members, tenant, groups=groups)
    r = VllmEngine(members, tenant, groups=groups, policy=policy)
    assert r.sched.recompute_kv_load_failures == (policy == "recompute")
    req = vllm_request("reader", PROMPT)
    r.add(req)
    r.step()
    r.settle()  # the lookup leased three blocks
    # The third block's object leaves the server between lookup and load (a removal wins
    # over a lease: the same outcome as a lease that expired and an eviction that followed).
    conn = w.worker
    with dfkv.Client(members, namespace=conn._client.namespace) as c:
        for g in range(groups):
            assert c.remove(conn._key(bytes(req.block_hashes[2]), g, 0, 0))
    r.run(["reader"])
    before, intact = r.first_forward["reader"]
    assert before == 2 * VLLM_BLOCK and intact  # the two blocks that arrived are used
    assert r.computed_by_forward["reader"] == len(PROMPT) - 2 * VLLM_BLOCK  # the rest recomputed
    assert "ERROR" not in str(r.finished["reader"].finish_reason)


def test_first_block_gone_recomputes_everything(members, tenant):
    import dfkv

    w = _write(members, tenant)
    r = VllmEngine(members, tenant)
    req = vllm_request("reader", PROMPT)
    r.add(req)
    r.step()
    r.settle()
    with dfkv.Client(members, namespace=w.worker._client.namespace) as c:
        assert c.remove(w.worker._key(bytes(req.block_hashes[0]), 0, 0, 0))
    r.run(["reader"])
    assert r.computed_by_forward["reader"] >= len(PROMPT)  # nothing usable: all computed
    assert "ERROR" not in str(r.finished["reader"].finish_reason)


def test_dead_node_costs_one_deadline(tenant):
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = VllmEngine(f"n1=127.0.0.1:{port}", tenant, lookup_cooldown_s=60)
    for i in range(3):
        r.add(vllm_request(f"r{i}", [i] + PROMPT))
    t0 = time.monotonic()
    r.run([f"r{i}" for i in range(3)])
    assert all(r.computed_by_forward[f"r{i}"] == len(PROMPT) + 1 for i in range(3))
    assert time.monotonic() - t0 < 30


def test_oversized_block_object_refuses_at_start(small_server, tenant):
    # one block object here is 512 bytes (2 layers x 2 x 4 tokens x 2 heads x 8 x bf16); the
    # server accepts 300
    with pytest.raises(ValueError, match=r"accept at most 300 bytes; start dfkv_server with --max-msg 512"):
        VllmEngine(f"n1={small_server}", tenant)


PROMPT30 = list(range(300, 330))  # 30 tokens: 3 scheduler blocks of 8 can come from dfkv


def _roundtrip(members, tenant, prompt, **kw):
    """A writer engine computes and saves the prompt; a second engine (same configuration)
    looks it up, loads asynchronously and finishes. Returns the reader."""
    w = VllmEngine(members, tenant, **kw)
    assert w.sched.connector.enabled and all(x.enabled for x in w.workers)
    w.add(w.request("writer", prompt))
    w.run(["writer"])
    assert w.computed_by_forward["writer"] == len(prompt)
    r = VllmEngine(members, tenant, **kw)
    req = r.request("reader", prompt)
    r.add(req)
    assert r.step().num_scheduled_tokens == {}  # lookup in flight
    r.settle()
    r.run(["reader"])
    assert "ERROR" not in str(r.finished["reader"].finish_reason)
    return r, w, req


def test_prefix_match_unit_loads_the_right_blocks(members, tenant):
    """Two KV cache groups with prefix_match_unit 2: vLLM hashes 2-token units while a paged
    block holds 4 tokens. Each block is keyed by the hash of the unit that ends it, so the
    reader's blocks hold exactly the writer's bytes."""
    r, w, _ = _roundtrip(members, tenant, PROMPT, groups=2, prefix_match_unit=2)
    c = r.sched.connector
    assert (r.hash_bs, r.sched_bs, c.hash_tokens, c.sched_tokens) == (2, VLLM_BLOCK, 2, VLLM_BLOCK)
    assert r.first_forward["reader"] == (3 * VLLM_BLOCK, True)  # three blocks, byte-exact
    assert r.computed_by_forward["reader"] == len(PROMPT) - 3 * VLLM_BLOCK


@pytest.mark.parametrize("kw,prompt,diverge,expect", [
    (dict(groups=2, prefix_match_unit=2), PROMPT, 7, 4),
    (dict(groups=2, block_sizes=[4, 8]), PROMPT30, 13, 8),
], ids=["prefix-unit-2", "blocks-4-and-8"])
def test_prompt_diverging_inside_a_block_hits_only_before_it(members, tenant, kw, prompt, diverge, expect):
    """A reader whose prompt differs from the writer's at one token inside a block hits only
    the blocks before that one: a block keyed by a hash unit that does not end it (e.g. the
    i-th hash for the i-th block) would match the shared first part and load the writer's
    bytes for tokens the reader does not have."""
    w = VllmEngine(members, tenant, **kw)
    w.add(w.request("writer", prompt))
    w.run(["writer"])
    other = list(prompt)
    other[diverge] += 1000
    r = VllmEngine(members, tenant, **kw)
    r.add(r.request("reader", other))
    r.run(["reader"])
    assert r.first_forward["reader"] == (expect, True)
    assert r.computed_by_forward["reader"] == len(other) - expect


def test_prefix_match_unit_keys_differ_from_per_block_hashing(members, tenant):
    """An engine hashing at 4 tokens stores other keys than one hashing at 2 (its namespace
    says so): it never reads objects keyed at another granularity."""
    _roundtrip(members, tenant, PROMPT, groups=2, prefix_match_unit=2)
    r = VllmEngine(members, tenant, groups=2)
    r.add(r.request("other", PROMPT))
    r.run(["other"])
    assert r.computed_by_forward["other"] == len(PROMPT)


def test_groups_with_different_block_sizes_load_the_right_blocks(members, tenant):
    """Groups of 4- and 8-token blocks: vLLM hashes 4-token units (their GCD) and schedules
    8-token blocks (their LCM); the 8-token group's block is keyed by every second hash."""
    r, _, _ = _roundtrip(members, tenant, PROMPT30, groups=2, block_sizes=[4, 8])
    assert (r.hash_bs, r.sched_bs) == (4, 8)
    assert r.first_forward["reader"] == (24, True)  # checked when the request first ran
    assert r.computed_by_forward["reader"] == len(PROMPT30) - 24


@pytest.mark.parametrize("groups", [1, 2], ids=["one-group", "hma"])
def test_dcp_each_rank_loads_its_own_shard(members, tenant, groups):
    """DCP 2 over TP 2: a paged block spans 8 tokens (4 per rank) and vLLM hashes 8-token
    units. Each rank stores its shard under its DCP rank and loads exactly its own bytes
    (the fake forward writes different bytes per rank, so a swapped shard fails)."""
    r, w, req = _roundtrip(members, tenant, PROMPT30, groups=groups, tp=2, dcp=2)
    assert (r.hash_bs, r.sched_bs) == (8, 8)
    assert [x.dcp_rank for x in r.workers] == [0, 1]
    assert r.first_forward["reader"] == (24, True)
    assert r.computed_by_forward["reader"] == len(PROMPT30) - 24
    # the two ranks' objects of one block differ, and each is its rank's bytes
    import dfkv

    h = bytes(req.block_hashes[0])
    with dfkv.Client(members, namespace=w.worker._client.namespace) as c:
        objs = [c.get_auto(x._key(h, 0, x.tp_rank, 0, x.dcp_rank), cap=1 << 20) for x in w.workers]
    assert objs[0] is not None and objs[1] is not None and objs[0] != objs[1]


def test_dcp_one_rank_missing_recomputes_from_there(members, tenant):
    """A hit needs every rank's shard: with rank 1's object of the third block gone, the
    lookup stops at two blocks and vLLM computes the rest."""
    import dfkv

    w = VllmEngine(members, tenant, tp=2, dcp=2)
    wreq = w.request("writer", PROMPT30)
    w.add(wreq)
    w.run(["writer"])
    x = w.workers[1]
    with dfkv.Client(members, namespace=x._client.namespace) as c:
        assert c.remove(x._key(bytes(wreq.block_hashes[2]), 0, x.tp_rank, 0, x.dcp_rank))
    r = VllmEngine(members, tenant, tp=2, dcp=2)
    r.add(r.request("reader", PROMPT30))
    r.run(["reader"])
    assert r.first_forward["reader"] == (16, True)
    assert r.computed_by_forward["reader"] == len(PROMPT30) - 16


def test_mla_under_dcp_each_rank_reads_its_shard(members, tenant):
    """MLA, TP 4, DCP 2: TP ranks 0 and 2 hold DCP shard 0, ranks 1 and 3 shard 1. One object
    per shard (TP replicated, DCP rank in the key), written by ranks 0 and 1 only; every rank
    loads its own shard's latent."""
    import dfkv

    r, w, req = _roundtrip(members, tenant, PROMPT30, tp=4, dcp=2, use_mla=True)
    assert [x.dcp_rank for x in r.workers] == [0, 1, 0, 1]
    assert [x._writes(0) for x in w.workers] == [True, True, False, False]
    assert r.first_forward["reader"] == (24, True)  # ranks 2 and 3 hold shards 0 and 1
    h = bytes(req.block_hashes[0])
    x = w.worker
    with dfkv.Client(members, namespace=x._client.namespace) as c:
        got = [c.get_auto(x._key(h, 0, 0, 0, d), cap=1 << 20) for d in (0, 1)]
    assert got[0] is not None and got[1] is not None and got[0] != got[1]


def test_prefill_context_parallel_is_refused_by_name(members, tenant, caplog):
    """PCP > 1 is the one layout the connector does not serve: it says so and stays off."""
    import logging

    with caplog.at_level(logging.WARNING, logger="dfkv.connectors.vllm"):
        e = VllmEngine(members, tenant, pcp=2)
    assert not e.sched.connector.enabled
    assert "prefill context parallelism (prefill_context_parallel_size=2) is not supported" in caplog.text
    e.add(e.request("r", PROMPT))
    e.run(["r"])
    assert e.computed_by_forward["r"] == len(PROMPT)


def test_kv_role_consumer_never_saves_producer_never_looks_up(members, tenant):
    c = VllmEngine(members, tenant, kv_role="kv_consumer", use_mla="false")
    assert c.worker.use_mla is False  # a boolean string is a boolean
    c.add(vllm_request("consumer", PROMPT))
    c.run(["consumer"])
    r = VllmEngine(members, tenant)
    r.add(vllm_request("reader", PROMPT))
    r.run(["reader"])
    assert r.computed_by_forward["reader"] == len(PROMPT)  # the consumer stored nothing
    # (that kv_both reader stored the blocks, so they are there now)
    p = VllmEngine(members, tenant, kv_role="kv_producer")
    p.add(vllm_request("producer", PROMPT))
    p.run(["producer"])
    assert p.computed_by_forward["producer"] == len(PROMPT)  # a producer never loads
    r = VllmEngine(members, tenant)
    r.add(vllm_request("reader2", PROMPT))
    r.run(["reader2"])
    assert r.first_forward["reader2"] == (3 * VLLM_BLOCK, True)


def test_hash_unit_ending_no_block_is_refused_by_name(members, tenant, caplog):
    """The other layout the connector refuses: vLLM hashing a unit that does not divide a
    group's block (what vLLM hands over with a Mamba group outside cache mode "align": the
    hash unit falls back to the scheduler block, coarser than the attention group's), so no
    hash names that block. Built through vLLM's KVConnectorFactory with the KVCacheConfig
    the engine core would pass."""
    import logging

    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    from engine_support import VLLM_HEAD, VLLM_HEADS, VLLM_LAYERS, vllm_configs

    cfg, kvc = vllm_configs(members, tenant)
    kvc.kv_cache_groups = [KVCacheGroupSpec(layer_names=[n], kv_cache_spec=FullAttentionSpec(
        block_size=b, num_kv_heads=VLLM_HEADS, head_size=VLLM_HEAD, dtype=torch.bfloat16))
        for n, b in zip(VLLM_LAYERS, (4, 8))]
    kvc.hash_block_size = 8
    with caplog.at_level(logging.WARNING, logger="dfkv.connectors.vllm"):
        c = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kvc)
    assert not c.enabled
    assert ("vLLM hashes units of 8 tokens and schedules blocks of 8; KV cache group(s) [0] "
            "have blocks of [4] tokens") in caplog.text
    kvc.hash_block_size = 4  # what vLLM resolves for these groups itself: served
    assert KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kvc).enabled


def test_uniform_type_specs_worker_shares_the_schedulers_namespace(members, tenant):
    """Workers may get a group spec of UniformTypeKVCacheSpecs while vLLM hands the scheduler
    its first layer's spec (generate_scheduler_kv_cache_config): both sides must derive the
    same namespace, or the scheduler would never find what the workers store."""
    import copy

    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, UniformTypeKVCacheSpecs

    from engine_support import VLLM_HEAD, VLLM_HEADS, VLLM_LAYERS, vllm_configs

    cfg, kvc = vllm_configs(members, tenant)
    spec = FullAttentionSpec(block_size=VLLM_BLOCK, num_kv_heads=VLLM_HEADS, head_size=VLLM_HEAD,
                             dtype=torch.bfloat16)
    kvc.kv_cache_groups = [KVCacheGroupSpec(layer_names=list(VLLM_LAYERS), kv_cache_spec=UniformTypeKVCacheSpecs(
        block_size=VLLM_BLOCK, kv_cache_specs={n: spec for n in VLLM_LAYERS}))]
    sched_kvc = generate_scheduler_kv_cache_config([copy.deepcopy(kvc)])
    assert type(sched_kvc.kv_cache_groups[0].kv_cache_spec) is FullAttentionSpec
    s = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, sched_kvc)
    w = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kvc)
    assert s._client.namespace == w._client.namespace
