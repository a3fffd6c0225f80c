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


def test_prefix_match_unit_never_pairs_wrong_blocks(members, tenant):
    """Two KV cache groups with prefix_match_unit 2: vLLM hashes 2-token units while a paged
    block holds 4 tokens. Keyed per block, hashes would pair with the wrong blocks: the
    connector must turn itself off (no hits, no saves) rather than load wrong bytes."""
    w = VllmEngine(members, tenant, groups=2, prefix_match_unit=2)
    assert not w.sched.connector.enabled and not w.worker.enabled
    w.add(vllm_request("writer", PROMPT))
    w.run(["writer"])
    r = VllmEngine(members, tenant, groups=2)
    r.add(vllm_request("reader", PROMPT))
    r.run(["reader"])
    assert r.computed_by_forward["reader"] == len(PROMPT)  # nothing was saved to hit


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
