"""SGLang HiCache rail affinity and RDMA depth, through the real libdfkv.so and a real
dfkv_server serving four soft RDMA rails (soft0..soft3, the software NIC).

Each worker runs in a fresh interpreter, as SGLang's workers do (the per-process settings
are process-wide). libdfkv reads its DFKV_RDMA_* settings from the live environment when a
client opens, so the connector sets them in os.environ just before; one worker first opens
another client, so the library is already loaded when the connector's settings arrive.
What a worker reports comes from the library itself: its per-rail op counters
(``dfkv_rdma_client_rail_ops_total{rail=...}``), its SG lane connections and its transport
mode.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory",
                    reason="sglang is not installed (tools/test.sh installs sglang==0.5.23 --no-deps)")

from engine_support import run_engine_script  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402

from dfkv.connectors.sglang_hicache import physical_rank, rail_affinity_env  # noqa: E402

RAILS = ["soft0", "soft1", "soft2", "soft3"]


def _sc(tp_rank=0, tp_size=1, dp_rank=0, cp_rank=0, cp_size=1, pp_rank=0):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=1,
                                attn_cp_rank=cp_rank, attn_cp_size=cp_size, is_mla_model=False,
                                enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="m", dp_rank=dp_rank)


@pytest.mark.parametrize("rank,fallbacks,dev", [
    (0, 1, "soft0,soft1"),
    (1, 1, "soft1,soft2"),
    (3, 1, "soft3,soft0"),   # wraps to the first rail
    (5, 1, "soft1,soft2"),   # rank % rail_count
    (2, 0, "soft2"),         # 0 disables fallbacks
    (2, 2, "soft2,soft3,soft0"),
    (2, 9, "soft2,soft3,soft0,soft1"),  # at most every other rail
])
def test_rail_affinity_env(rank, fallbacks, dev):
    env = rail_affinity_env(rank, RAILS, fallbacks)
    assert env == {"DFKV_RDMA_DEV": dev, "DFKV_RDMA_PRIMARY_DEV": dev.split(",")[0],
                   "DFKV_RDMA_NUMA": "0", "DFKV_RDMA_TIERS": ""}


@pytest.mark.parametrize("args", [(0, [], 1), (0, ["a", "a"], 1), (-1, RAILS, 1), (0, RAILS, -1)])
def test_rail_affinity_env_refuses(args):
    with pytest.raises(ValueError):
        rail_affinity_env(*args)


def test_physical_rank_not_tp_rank_under_dp_attention():
    # DP attention, attention TP 1: every worker's storage tp_rank is 0; dp_rank tells them apart.
    assert [physical_rank(_sc(dp_rank=d)) for d in range(4)] == [0, 1, 2, 3]
    # attention TP 2 x DP 2: SGLang's rule tp = (dp * cp_size + cp) * attn_tp + attn_tp_rank.
    assert [physical_rank(_sc(tp_rank=t, tp_size=2, dp_rank=d)) for d in range(2) for t in range(2)] == [0, 1, 2, 3]
    assert physical_rank(_sc(tp_rank=1, tp_size=2, dp_rank=1, cp_rank=1, cp_size=2)) == 7
    # Without DP attention the storage tp_rank is already the global one.
    assert physical_rank(_sc(tp_rank=6, tp_size=8)) == 6
    # An explicit rank wins.
    assert physical_rank(_sc(dp_rank=3), {"rail_affinity_rank": 9}) == 9


def test_physical_rank_from_sglang_parallel_context():
    """Inside SGLang the live global parallel context is the authority: under DP attention the
    storage config says tp_rank 0 while the process is global TP rank 5."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=5, tp_size=8, pp_rank=0, pp_size=1):
        assert physical_rank(_sc(tp_rank=0, dp_rank=5)) == 5
        assert physical_rank(_sc(tp_rank=0, dp_rank=0)) == 5  # the config alone would say 0
    with get_parallel().override(tp_rank=3, tp_size=4, pp_rank=1, pp_size=2):
        assert physical_rank(_sc(tp_rank=0)) == 7


@pytest.fixture(scope="module")
def rails_members(tmp_path_factory):
    """A dfkv_server serving RDMA on four soft rails."""
    from conftest import _run_server

    for addr in _run_server(tmp_path_factory, "dfkv_server_rails", "--rdma", "--rdma-provider", "soft",
                            "--rdma-dev", ",".join(RAILS)):
        yield f"n1={addr}"


WORKER = """
    import hashlib, json, os, torch
    from engine_support import MirrorMHAHostPool, page_keys, sglang_backend

    def stats(c):
        out = {{}}
        for line in c.stats_snapshot().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
        return out

    if {preload!r}:  # the library is loaded (and a client open) before the connector's settings
        import dfkv
        dfkv.Client({members!r}, namespace=b"preload").close()
    pool = MirrorMHAHostPool(layer_num=2, head_num=2, head_dim=64, page_size=16, size=256, layout="page_first")
    pool.fill(5)
    b = sglang_backend({members!r}, {tenant!r}, pool, tp_rank=0, tp_size=1, dp_rank={dp_rank},
                       extra={extra!r})
    keys = page_keys({tenant!r} + "/{dp_rank}", 6)
    put = b.batch_set_v1(keys, torch.arange(16, 16 + 6 * 16))
    got = b.batch_get_v1(keys, torch.arange(128, 128 + 6 * 16))
    same = [hashlib.sha256(pool.page_bytes(1 + i)).hexdigest() for i in range(6)] == \\
           [hashlib.sha256(pool.page_bytes(8 + i)).hexdigest() for i in range(6)]
    c = b.client
    s = stats(c)
    rails = {{r: s.get('dfkv_rdma_client_rail_ops_total{{rail="%s"}}' % r, 0.0) for r in {rails!r}}}
    print(json.dumps({{"put": put, "get": got, "same": same, "mode": c.transport_mode, "rails": rails,
                      "rank": b.rail_rank, "env": {{k: os.environ.get(k) for k in
                      ("DFKV_RDMA_DEV", "DFKV_RDMA_PRIMARY_DEV", "DFKV_RDMA_NUMA", "DFKV_RDMA_DEPTH")}},
                      "lane_opened": s.get("dfkv_rdma_sg_lane_conns_opened_total", -1),
                      "lane_width": s.get("dfkv_rdma_sg_lane_busy_max", -1),
                      "qp_max": s.get("dfkv_rdma_sg_qp_inflight_max", -1)}}))
    b.close()
"""


def _worker(members, dp_rank, extra, env=None, preload=False):
    tenant = "t-" + uuid.uuid4().hex[:12]
    base = {"batch_concurrency": 1, "rail_affinity": 1, "rail_affinity_devices": ",".join(RAILS)}
    base.update(extra)
    r = run_engine_script(WORKER.format(preload=preload, members=members, tenant=tenant, dp_rank=dp_rank, extra=base, rails=RAILS),
                          env={"DFKV_RDMA": "1", "DFKV_RDMA_PROVIDER": "soft", "DFKV_SOFT_RDMA_DEVICES": "4",
                               **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(out))  # shown when an assertion below fails
    assert out["put"] == [True] * 6 and out["get"] == [True] * 6 and out["same"], out
    return out


@pytest.mark.parametrize("dp_rank,depth,preload", [(1, 2, False), (2, 4, True)])
def test_dp_attention_workers_use_their_physical_rank_rail_and_depth(rails_members, dp_rank, depth, preload):
    """Two DP-attention workers (tp_rank 0 in both storage configs) land on different rails,
    rail = physical rank % 4, every op on it; the connector's rdma_depth reaches the
    library: one batch of 6 two-segment pages fans out over exactly `depth` SG-lane
    connections, one request in flight on each."""
    out = _worker(rails_members, dp_rank, {"rdma_depth": depth}, preload=preload)
    want = RAILS[dp_rank]
    assert out["rank"] == dp_rank, out
    assert out["mode"] == "rdma", out
    # 18 = 6 EXISTs (skip_existing's probe) + 6 PUTs + 6 GETs, every one on the worker's rail.
    assert out["rails"][want] == 18 and sum(out["rails"].values()) == 18, out
    assert out["env"] == {"DFKV_RDMA_DEV": f"{want},{RAILS[dp_rank + 1]}", "DFKV_RDMA_PRIMARY_DEV": want,
                          "DFKV_RDMA_NUMA": "0", "DFKV_RDMA_DEPTH": str(depth)}, out
    assert out["lane_opened"] == depth and out["lane_width"] == depth, out
    assert out["qp_max"] == 1, out


@pytest.mark.parametrize("fallbacks", [0, 1, 2])
def test_fallback_rails_when_the_primary_rail_is_down(rails_members, tmp_path, fallbacks):
    """Worker of physical rank 1 whose own soft1 port is down (the client's fault file):
    with fallbacks 0 it has no rail and goes over TCP (still correct); with 1 every op runs on
    soft2; with 2 on soft2/soft3, never on soft1 or a rail outside its choice."""
    faults = tmp_path / "faults"
    faults.write_text("soft1 port down\n")
    out = _worker(rails_members, 1, {"rail_affinity_fallbacks": fallbacks},
                  env={"DFKV_SOFT_RDMA_FAULTS": str(faults)})
    chosen = [RAILS[(1 + k) % 4] for k in range(fallbacks + 1)]
    assert out["env"]["DFKV_RDMA_DEV"] == ",".join(chosen), out
    assert out["rails"]["soft1"] == 0 and out["rails"]["soft0"] == 0, out
    if fallbacks == 0:
        assert out["mode"].startswith("tcp("), out
        assert sum(out["rails"].values()) == 0, out
    else:
        assert out["mode"] == "rdma", out
        assert sum(out["rails"][r] for r in chosen[1:]) == 18, out  # 6 EXIST + 6 PUT + 6 GET
        if fallbacks == 1:
            assert out["rails"]["soft2"] == 18, out


def test_rail_affinity_off_leaves_the_environment(monkeypatch):
    from dfkv.connectors.sglang_hicache import DfkvHiCacheStorage

    monkeypatch.delenv("DFKV_RDMA_DEV", raising=False)
    sc = _sc(dp_rank=2)
    sc.extra_config = {"members": "n1=127.0.0.1:1"}
    b = DfkvHiCacheStorage(sc, None)
    assert b.rail_env == {} and b.cfg.library_env() == {} and "DFKV_RDMA_DEV" not in os.environ
    sc.extra_config = {"members": "n1=127.0.0.1:1", "rail_affinity": "1", "rail_affinity_devices": RAILS,
                       "rdma_depth": 3}
    b = DfkvHiCacheStorage(sc, None)
    assert b.rail_rank == 2
    assert b.cfg.library_env() == {"DFKV_RDMA_DEV": "soft2,soft3", "DFKV_RDMA_PRIMARY_DEV": "soft2",
                                   "DFKV_RDMA_NUMA": "0", "DFKV_RDMA_TIERS": "", "DFKV_RDMA_DEPTH": "3"}
