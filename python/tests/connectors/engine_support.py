"""Helpers for the engine-connector tests: engine imports, host-pool mirrors, builders.

Engines are imported from their real PyPI packages (versions pinned in tools/test.sh and
python/pyproject.toml); a test module skips, with the reason, when its engine is absent.

The one thing copied from an engine is SGLang's host KV pool *page-address arithmetic*
(``MirrorMHAHostPool`` / ``MirrorMLAHostPool``), because the real host pools
(sglang/srt/mem_cache/pool_host/mha.py and mla.py in sglang 0.5.23) can only be built with a
device KV pool behind them and pull in torchvision through their imports. The mirrors copy
``get_page_buffer_meta`` (mha.py ``MHATokenToKVPoolHost.get_page_buffer_meta``, lines 817-876,
and mla.py ``MLATokenToKVPoolHost.get_page_buffer_meta``, non-split layouts) and
``init_kv_buffer``'s buffer shapes line for line over a real torch tensor. Everything else
(``HiCacheStorage``, ``HiCacheStorageConfig``, ``StorageBackendFactory``, ``PoolTransfer`` ...)
is the real SGLang code.

This module is also imported by the subprocesses that read back what the test process
wrote (``run_engine_script``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Optional

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parents[1]

SGLANG_VERSION = "0.5.23"
LMCACHE_VERSION = "0.5.6"
VLLM_VERSION = "0.33.0"
TORCH_VERSION = "2.14.1"


def run_engine_script(code: str, env: Optional[Dict[str, str]] = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports dfkv from the source tree and this
    helper module (the "second process" of the cross-process round trips)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), str(HERE), e.get("PYTHONPATH", "")])
    e.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------
# SGLang host pool mirrors (see the module docstring for what is copied from where)


class MirrorMHAHostPool:
    """MHATokenToKVPoolHost's buffer and page-address arithmetic (sglang 0.5.23)."""

    def __init__(self, layer_num: int, head_num: int, head_dim: int, page_size: int, size: int,
                 layout: str = "page_first", dtype: Any = None):
        import torch

        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        self.page_size, self.size, self.layout = page_size, size, layout
        self.dtype = dtype or torch.bfloat16
        if layout == "layer_first":
            dims = (2, self.layer_num, self.size, self.head_num, self.head_dim)
        elif layout in ("page_first", "page_first_direct"):
            dims = (2, self.size, self.layer_num, self.head_num, self.head_dim)
        else:
            raise ValueError(layout)
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)

    # mha.py:713-760 (get_data_page / get_dummy_flat_data_page / set_from_flat_data_page),
    # the flat data page of the controller's generic (interface_v1=0) path
    def get_data_page(self, index, flat: bool = True):
        if self.layout == "layer_first":
            data_page = self.kv_buffer[:, :, index: index + self.page_size, :, :]
        else:
            data_page = self.kv_buffer[:, index: index + self.page_size, :, :, :]
        return data_page.flatten() if flat else data_page

    def get_dummy_flat_data_page(self):
        import torch

        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index: index + self.page_size, :, :] = data_page.reshape(
                2, self.layer_num, self.page_size, self.head_num, self.head_dim)
        else:
            self.kv_buffer[:, index: index + self.page_size, :, :, :] = data_page.reshape(
                2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices):  # mha.py:817-876, verbatim logic
        assert len(indices) % self.page_size == 0
        ptr_list = []
        kv_buffer_data_ptr = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * self.dtype.itemsize
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = (kv_buffer_data_ptr
                             + indices[index] * self.head_num * self.head_dim * self.dtype.itemsize
                             + layer_id * self.size * self.head_num * self.head_dim * self.dtype.itemsize)
                    v_ptr = k_ptr + v_offset
                    ptr_list.append(k_ptr)
                    ptr_list.append(v_ptr)
            element_size = self.dtype.itemsize * self.page_size * self.head_num * self.head_dim
            element_size_list = [element_size] * len(ptr_list)
        elif self.layout in ["page_first", "page_first_direct", "page_head"]:
            for index in range(0, len(indices), self.page_size):
                k_ptr = (kv_buffer_data_ptr
                         + indices[index] * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize)
                v_ptr = k_ptr + v_offset
                ptr_list.append(k_ptr)
                ptr_list.append(v_ptr)
            element_size = (self.layer_num * self.dtype.itemsize * self.page_size * self.head_num
                            * self.head_dim)
            element_size_list = [element_size] * len(ptr_list)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return ptr_list, element_size_list

    def page_bytes(self, page: int) -> bytes:
        """The page's K then V bytes as the mirror lays them out (for assertions)."""
        ps = self.page_size
        if self.layout == "layer_first":
            parts = []
            for layer in range(self.layer_num):
                parts.append(self.kv_buffer[0, layer, page * ps:(page + 1) * ps].contiguous())
                parts.append(self.kv_buffer[1, layer, page * ps:(page + 1) * ps].contiguous())
        else:
            parts = [self.kv_buffer[0, page * ps:(page + 1) * ps].contiguous(),
                     self.kv_buffer[1, page * ps:(page + 1) * ps].contiguous()]
        return b"".join(p.view(-1).view(__import__("torch").uint8).numpy().tobytes() for p in parts)

    def fill(self, seed: int) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.kv_buffer.copy_(torch.randn(self.kv_buffer.shape, generator=g).to(self.dtype))


class MirrorMLAHostPool:
    """MLATokenToKVPoolHost (non-split layouts, no DCP) buffer and page addresses."""

    def __init__(self, layer_num: int, kv_lora_rank: int, qk_rope_head_dim: int, page_size: int,
                 size: int, layout: str = "page_first", dtype: Any = None):
        import torch

        self.layer_num, self.page_size, self.size, self.layout = layer_num, page_size, size, layout
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.logical_page_size = page_size
        self.dtype = dtype or torch.bfloat16
        if layout == "layer_first":
            dims = (self.layer_num, self.size, 1, self.kv_cache_dim)
        else:
            dims = (self.size, self.layer_num, 1, self.kv_cache_dim)
        self.kv_buffer = torch.zeros(dims, dtype=self.dtype)

    def _storage_page_index(self, index: int) -> int:
        return index

    def get_page_buffer_meta(self, indices):  # mla.py, non-split branch
        assert len(indices) % self.logical_page_size == 0
        ptr_list = []
        kv_buffer_data_ptr = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        page_starts = [self._storage_page_index(index) for index in indices[:: self.logical_page_size]]
        if self.layout == "layer_first":
            for index in page_starts:
                for layer_id in range(self.layer_num):
                    ptr_list.append(kv_buffer_data_ptr + index * self.kv_cache_dim * self.dtype.itemsize
                                    + layer_id * self.size * self.kv_cache_dim * self.dtype.itemsize)
            element_size = self.dtype.itemsize * self.page_size * self.kv_cache_dim
        else:
            for index in page_starts:
                ptr_list.append(kv_buffer_data_ptr + index * self.layer_num * self.kv_cache_dim * self.dtype.itemsize)
            element_size = self.layer_num * self.dtype.itemsize * self.page_size * self.kv_cache_dim
        return ptr_list, [element_size] * len(ptr_list)

    def fill(self, seed: int) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.kv_buffer.copy_(torch.randn(self.kv_buffer.shape, generator=g).to(self.dtype))


def sglang_backend(members: str, tenant: str, pool: Any, *, tp_rank: int = 0, tp_size: int = 1,
                   mla: bool = False, extra: Optional[Dict[str, Any]] = None, dp_rank: int = 0) -> Any:
    """Build the dfkv backend exactly as SGLang does: HiCacheStorageConfig + the real
    StorageBackendFactory's dynamic path, then register_mem_pool_host."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    cfg = {"backend_name": "dfkv", "module_path": "dfkv.connectors.sglang_hicache",
           "class_name": "DfkvHiCacheStorage", "interface_v1": 1, "members": members,
           "tenant": tenant}
    cfg.update(extra or {})
    sc = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                              attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                              is_page_first_layout=True, model_name="dfkv-test/tiny-model",
                              dp_rank=dp_rank, extra_config=cfg)
    backend = StorageBackendFactory.create_backend("dynamic", sc, pool)
    backend.register_mem_pool_host(pool)
    return backend


def page_keys(tag: str, n: int) -> list:
    import hashlib

    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(n)]


# ---------------------------------------------------------------------------------------
# LMCache


def lmcache_parts(members: str, tenant: str, *, chunk: int = 16, layers: int = 2, heads: int = 2,
                  head_dim: int = 8, url: Optional[str] = None, plugin_url: Optional[str] = None):
    """(config, metadata, local_cpu_backend) as LMCache builds them for a worker, with the dfkv
    adapter registered through remote_storage_plugins + extra_config (LMCache's own keys)."""
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    extra = {
        "remote_storage_plugin.dfkv.module_path": "dfkv.connectors.lmcache_remote",
        "remote_storage_plugin.dfkv.class_name": "DfkvConnectorAdapter",
        "remote_storage_plugin.dfkv.members": members,
        "remote_storage_plugin.dfkv.tenant": tenant,
        "save_chunk_meta": False,
    }
    if plugin_url is not None:
        extra["remote_storage_plugin.dfkv.url"] = plugin_url
    kwargs = dict(chunk_size=chunk, local_cpu=True, max_local_cpu_size=0.05,
                  remote_storage_plugins=["dfkv"], extra_config=extra, save_unfull_chunk=True)
    if url is not None:
        kwargs["remote_url"] = url
    config = LMCacheEngineConfig.from_defaults(**kwargs)
    metadata = LMCacheMetadata(model_name="dfkv-test/tiny-model", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(layers, 2, chunk, heads, head_dim), chunk_size=chunk)
    backend = LocalCPUBackend(config, metadata)
    return config, metadata, backend


def lmcache_key(chunk_hash: int, model: str = "dfkv-test/tiny-model"):
    import torch
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(model_name=model, world_size=1, worker_id=0, chunk_hash=chunk_hash,
                          dtype=torch.bfloat16)


def lmcache_connector(loop, members: str, tenant: str, url: str = "plugin://dfkv", **kw):
    """The connector LMCache's RemoteBackend would use: built by the real ConnectorManager
    (CreateConnector), which loads the adapter from remote_storage_plugins/extra_config."""
    from lmcache.v1.storage_backend.connector import CreateConnector

    config, metadata, backend = lmcache_parts(members, tenant, **kw)
    conn = CreateConnector(url, loop, backend, config, metadata, plugin_name="dfkv")
    return conn, backend


# ---------------------------------------------------------------------------------------
# vLLM

VLLM_LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
VLLM_BLOCK, VLLM_NUM_BLOCKS, VLLM_HEADS, VLLM_HEAD = 4, 16, 2, 8


def vllm_configs(members: str, tenant: str, **extra: Any):
    """A real VllmConfig (CPU device) with --kv-transfer-config pointing at the dfkv module,
    and a KVCacheConfig of one full-attention group."""
    import torch
    from vllm.config import DeviceConfig, KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    ktc = KVTransferConfig(kv_connector="DfkvConnector", kv_connector_module_path="dfkv.connectors.vllm_v1",
                           kv_role="kv_both",
                           kv_connector_extra_config={"members": members, "tenant": tenant,
                                                      "model": "dfkv-test/tiny-model", **extra})
    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"), kv_transfer_config=ktc)
    cfg.cache_config.block_size = VLLM_BLOCK
    spec = FullAttentionSpec(block_size=VLLM_BLOCK, num_kv_heads=VLLM_HEADS, head_size=VLLM_HEAD,
                             dtype=torch.bfloat16)
    kvc = KVCacheConfig(num_blocks=VLLM_NUM_BLOCKS, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(layer_names=list(VLLM_LAYERS), kv_cache_spec=spec)])
    return cfg, kvc


def vllm_connectors(members: str, tenant: str, **extra: Any):
    """(scheduler-side, worker-side, kv_caches) built by vLLM's own KVConnectorFactory."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole

    cfg, kvc = vllm_configs(members, tenant, **extra)
    sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kvc)
    worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kvc)
    # FlashAttention's paged layout: (2, num_blocks, block_size, num_kv_heads, head_size)
    caches = {n: torch.zeros(2, VLLM_NUM_BLOCKS, VLLM_BLOCK, VLLM_HEADS, VLLM_HEAD, dtype=torch.bfloat16)
              for n in VLLM_LAYERS}
    worker.register_kv_caches(caches)
    return sched, worker, caches


def vllm_request(req_id: str, tokens: list, hash_tokens: int = VLLM_BLOCK):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256_cbor)
    return Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=SamplingParams(max_tokens=1),
                   pooling_params=None, block_hasher=get_request_block_hasher(hash_tokens, sha256_cbor))


def vllm_blocks(ids: list):
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    return KVCacheBlocks((tuple(KVCacheBlock(i) for i in ids),))


def vllm_step(sched: Any, worker: Any, new_reqs: list, block_ids: Dict[str, list]) -> Any:
    """One engine step: the scheduler builds real SchedulerOutput/metadata for requests
    scheduled in full, the worker binds it, loads, (forward), saves."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    new = [NewRequestData.from_request(r, (list(block_ids[r.request_id]),)) for r in new_reqs]
    sched_tokens = {r.request_id: len(r.prompt_token_ids) - r.num_computed_tokens for r in new_reqs}
    so = SchedulerOutput(scheduled_new_reqs=new, scheduled_cached_reqs=CachedRequestData.make_empty(),
                         num_scheduled_tokens=sched_tokens, total_num_scheduled_tokens=sum(sched_tokens.values()),
                         scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=set(),
                         free_encoder_mm_hashes=[])
    meta = sched.build_connector_meta(so)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for f in list(worker._load_jobs.values()):  # asynchronous loads: wait (bounded) for them
        f.result(timeout=60)
    for n in VLLM_LAYERS:
        worker.wait_for_layer_load(n)
    worker.wait_for_save()
    worker.loaded_last = {}
    _, recv = worker.get_finished(set())
    wm = worker.build_connector_worker_meta()
    if wm is not None:
        worker.loaded_last = dict(wm.loaded)
    worker.clear_connector_metadata()
    return meta


def vllm_match(sched: Any, req: Any, num_computed: int) -> Any:
    """get_num_new_matched_tokens as vLLM calls it: again (next step) while it answers None
    (the leased lookup is in flight), waiting for the lookup (bounded) in between."""
    for _ in range(3):
        res = sched.get_num_new_matched_tokens(req, num_computed)
        if res[0] is not None:
            return res
        lk = sched._lookups.get(req.request_id)
        if lk is not None and lk.fut is not None:
            lk.fut.result(timeout=60)
    raise AssertionError("lookup never answered")


def block_digest(caches: Dict[str, Any], block_ids: list) -> str:
    import hashlib

    import torch

    h = hashlib.sha256()
    for n in VLLM_LAYERS:
        t = caches[n]
        for b in block_ids:
            h.update(t[:, b].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# vLLM's own Scheduler, driven step by step on CPU


class NoModelConfig:
    """Stand-in for vLLM's ModelConfig (building the real one needs a model's HF config): only
    the fields the Scheduler and the connector read, with a text-only decoder's values. Every
    other attribute reads as None, like an unset optional field."""

    skip_tokenizer_init = True
    uses_mrope = False
    is_encoder_decoder = False
    max_model_len = 256
    runner_type = "generate"
    is_diffusion = False
    use_mla = False
    model = "dfkv-test/tiny-model"
    served_model_name = "dfkv-test/tiny-model"
    revision = None

    def __getattr__(self, name: str) -> Any:
        return None


def block_pattern(block_hash: bytes, layer: int, shape: Any, shard: int = 0) -> Any:
    """The KV a block "computes" to in the fake forward: a pure function of its block hash,
    layer and the rank's shard (what that rank holds of the block), so a loaded block can be
    checked byte for byte, per rank."""
    import hashlib

    import torch

    seed = int.from_bytes(hashlib.sha256(bytes(block_hash) + bytes([layer, shard])).digest()[:8], "little") >> 1
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


class VllmEngine:
    """vLLM's real ``Scheduler`` (built from a VllmConfig with the dfkv connector, CPU, no
    model) plus one worker-side connector per simulated rank over CPU paged KV tensors,
    stepped like vLLM's engine core: schedule -> every worker (bind metadata, start loads, fake
    forward that writes each computed block's pattern, save, transfer results) -> vLLM's own
    ``KVOutputAggregator`` -> update_from_output.

    ``block_sizes`` gives each KV cache group's block size (groups > 1: one group per layer);
    ``dcp`` sets decode context parallelism and ``tp`` the TP ranks simulated (each a worker
    connector with its own KV tensors; without torch.distributed groups the connector takes
    its TP rank from the extra config and its DCP rank as vLLM relates them, tp % dcp). The
    scheduler and hash block sizes come from vLLM's ``resolve_kv_cache_block_sizes`` and the
    requests are hashed at the hash size, as vLLM's engine core does."""

    def __init__(self, members: str, tenant: str, groups: int = 1, policy: Optional[str] = None,
                 prefix_match_unit: Optional[int] = None, kv_role: str = "kv_both",
                 block_sizes: Optional[list] = None, dcp: int = 1, tp: int = 1, pcp: int = 1,
                 layout: str = "split", make_caches: Optional[Any] = None, **extra: Any):
        import torch
        from vllm.config import DeviceConfig, KVTransferConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        kw = {} if policy is None else {"kv_load_failure_policy": policy}
        ktc = KVTransferConfig(kv_connector="DfkvConnector", kv_connector_module_path="dfkv.connectors.vllm_v1",
                               kv_role=kv_role, **kw,
                               kv_connector_extra_config={"members": members, "tenant": tenant,
                                                          "model": "dfkv-test/tiny-model", **extra})
        cfg = VllmConfig(device_config=DeviceConfig(device="cpu"), kv_transfer_config=ktc)
        object.__setattr__(cfg, "model_config", NoModelConfig())
        # the parallel sizes vLLM would have validated (tp % dcp == 0), set after construction
        # because a CPU VllmConfig with tp > 1 wants a distributed backend
        cfg.parallel_config.tensor_parallel_size = tp
        cfg.parallel_config.decode_context_parallel_size = dcp
        cfg.parallel_config.prefill_context_parallel_size = pcp
        cfg.cache_config.block_size = min(block_sizes or [VLLM_BLOCK])
        cfg.cache_config.num_gpu_blocks = VLLM_NUM_BLOCKS
        if prefix_match_unit is not None:
            cfg.cache_config.prefix_match_unit = prefix_match_unit
        # groups > 1: the hybrid (HMA) case, one group per layer
        names = [VLLM_LAYERS] if groups == 1 else [[n] for n in VLLM_LAYERS[:groups]]
        sizes = list(block_sizes or [VLLM_BLOCK] * len(names))
        specs = [FullAttentionSpec(block_size=b, num_kv_heads=VLLM_HEADS, head_size=VLLM_HEAD,
                                   dtype=torch.bfloat16) for b in sizes]
        self.kvc = KVCacheConfig(num_blocks=VLLM_NUM_BLOCKS, kv_cache_tensors=[],
                                 kv_cache_groups=[KVCacheGroupSpec(layer_names=list(n), kv_cache_spec=sp)
                                                  for n, sp in zip(names, specs)])
        # as vLLM's engine core: resolve the scheduler and hash block sizes, hand both to the
        # Scheduler and the hash size to every process through the KVCacheConfig
        self.sched_bs, self.hash_bs = resolve_kv_cache_block_sizes(self.kvc, cfg)
        self.kvc.hash_block_size = self.hash_bs
        self.sched = Scheduler(vllm_config=cfg, kv_cache_config=self.kvc,
                               structured_output_manager=StructuredOutputManager(cfg),
                               block_size=self.sched_bs, hash_block_size=self.hash_bs, log_stats=False)
        self.workers = []
        for r in range(tp):
            ktc.kv_connector_extra_config["tp_rank"] = r
            self.workers.append(KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, self.kvc))
        self.worker = self.workers[0]
        self.mla = bool(self.worker.use_mla)
        self.aggregator = KVOutputAggregator.from_connector(self.worker, len(self.workers))
        self.layer_group = {n: g for g, grp in enumerate(self.kvc.kv_cache_groups) for n in grp.layer_names}
        # a group's paged block spans block_size x dcp tokens (each rank holds its share)
        self.group_tokens = [sp.block_size * dcp for sp in specs]
        # layout "split": FlashAttention's (2, num_blocks, block, heads, head) (K/V first);
        # "contiguous": (num_blocks, 2, block, heads, head), a block's K and V adjacent.
        # make_caches(rank, worker, shapes) -> {layer: tensor} builds them otherwise (the
        # direct-load tests: memfd-backed views standing in for device memory).
        assert layout in ("split", "contiguous"), layout
        self.layout = layout
        shapes = {n: ((2, VLLM_NUM_BLOCKS) if layout == "split" else (VLLM_NUM_BLOCKS, 2))
                  + (sizes[g], VLLM_HEADS, VLLM_HEAD) for n, g in self.layer_group.items()}
        self.rank_caches = [make_caches(r, w, shapes) if make_caches is not None else
                            {n: torch.zeros(sh, dtype=torch.bfloat16) for n, sh in shapes.items()}
                            for r, w in enumerate(self.workers)]
        self.caches = self.rank_caches[0]
        for w, c in zip(self.workers, self.rank_caches):
            w.register_kv_caches(c)
        self.computed_by_forward: Dict[str, int] = {}  # request -> tokens the fake forward computed
        self.first_forward: Dict[str, Any] = {}  # request -> (tokens computed before, loaded blocks intact)
        self.finished: Dict[str, Any] = {}

    def request(self, req_id: str, tokens: list) -> Any:
        """A request hashed at this engine's hash block size."""
        return vllm_request(req_id, tokens, self.hash_bs)

    def shard(self, rank: int) -> int:
        """Which distinct bytes rank holds: MLA's latent is the same on the TP ranks of one
        DCP rank; otherwise every TP rank holds its own heads."""
        w = self.workers[rank]
        return w.dcp_rank if self.mla else rank

    def add(self, req: Any) -> None:
        self.sched.add_request(req)

    def step(self) -> Any:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.sched.schedule()
        for w in self.workers:
            w.bind_connector_metadata(so.kv_connector_metadata)
            w.start_load_kv(None)
        sampled = {}
        for rid, n in so.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            before = req.num_computed_tokens - n  # schedule() already counted this step
            if rid not in self.first_forward:
                self.first_forward[rid] = (before, all(self.block_ok(rid, req, u)
                                                       for u in range(before // self.sched_bs)))
            self._forward(req, before, before + n)
            self.computed_by_forward[rid] = self.computed_by_forward.get(rid, 0) + n
            sampled[rid] = [7] if before + n >= req.num_tokens else []
        rids = list(so.num_scheduled_tokens)
        outs = []
        for w in self.workers:
            w.wait_for_save()
            tr = w.get_transfer_results(so.finished_req_ids)
            out = KVConnectorOutput(finished_sending=tr.finished_sending or None,
                                    finished_recving=tr.finished_recving or None,
                                    failed_recving=tr.failed_recving,
                                    invalid_block_ids=w.get_block_ids_with_load_errors(),
                                    kv_connector_worker_meta=w.build_connector_worker_meta())
            w.clear_connector_metadata()
            outs.append(ModelRunnerOutput(req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
                                          sampled_token_ids=[sampled[r] for r in rids], kv_connector_output=out))
        res = self.sched.update_from_output(so, self.aggregator.aggregate(outs))
        for eco in res.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.finished[o.request_id] = o
        return so

    def _blocks(self, req: Any, lo: int, hi: int):
        """(rank, layer index, tensor, block id, block hash) of every paged block whose tokens
        end in (lo, hi]: group g's block i ends at (i + 1) x its span, and vLLM names it by
        the hash of the hash unit ending there."""
        ids = self.sched.kv_cache_manager.get_block_ids(req.request_id)
        hashes = list(req.block_hashes)
        for r, caches in enumerate(self.rank_caches):
            for li, (n, t) in enumerate(caches.items()):
                g = self.layer_group[n]
                gt = self.group_tokens[g]
                for i in range(lo // gt, hi // gt):
                    hi_idx = (i + 1) * gt // self.hash_bs - 1
                    if hi_idx < len(hashes) and i < len(ids[g]):
                        yield r, li, t, ids[g][i], bytes(hashes[hi_idx])

    def block(self, t: Any, bid: int) -> Any:
        """Block bid of a layer's KV tensor as (2, block, heads, head), in either layout."""
        return t[:, bid] if self.layout == "split" else t[bid]

    def _forward(self, req: Any, lo: int, hi: int) -> None:
        """Write the pattern of every block (on every rank) whose tokens [lo, hi) complete."""
        for r, li, t, bid, h in self._blocks(req, lo, hi):
            b = self.block(t, bid)
            b[...] = block_pattern(h, li, b.shape, self.shard(r))

    def settle(self) -> None:
        """Wait (bounded) for the connector's in-flight lookups and loads: the events the
        next step needs."""
        for lk in list(self.sched.connector._lookups.values()):
            if lk.fut is not None:
                lk.fut.result(timeout=60)
        for w in self.workers:
            for f in list(w._load_jobs.values()):
                f.result(timeout=60)

    def run(self, req_ids: list, max_steps: int = 50) -> int:
        """Step until every request finished; returns the steps taken (bounded)."""
        for i in range(max_steps):
            if all(r in self.finished for r in req_ids):
                return i
            self.step()
            self.settle()
        raise AssertionError(f"requests {req_ids} not finished in {max_steps} steps: {self.finished}")

    def block_ok(self, req_id: str, req: Any, u: int) -> bool:
        """Whether scheduler block u of a request holds its pattern in every group's blocks,
        every layer, on every rank (each rank its own shard's bytes)."""
        n = 0
        for r, li, t, bid, h in self._blocks(req, u * self.sched_bs, (u + 1) * self.sched_bs):
            n += 1
            b = self.block(t, bid)
            if not torch_equal(b, block_pattern(h, li, b.shape, self.shard(r))):
                return False
        return n > 0


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


# ---------------------------------------------------------------------------------------
# KV events (docs/EVENTS.md): a dfkv_server with --kv-events and a pyzmq subscriber


def events_server(tmp_path_factory, name: str, *extra: str):
    """Run a dfkv_server publishing KV events; yields (members, PUB endpoint)."""
    import socket

    from conftest import _run_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        pub = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    for addr in _run_server(tmp_path_factory, name, "--kv-events", pub, *extra):
        yield f"n1={addr}", pub


class EventSubscriber:
    """A pyzmq SUB on a node's stream, decoding every batch with an engine's own msgspec
    class. ``collect`` gathers the events that ``keep`` accepts until ``done`` holds (or
    its deadline passes)."""

    def __init__(self, pub: str, batch_type: Any):
        import msgspec
        import zmq

        self._ctx = zmq.Context()
        self.sub = self._ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(pub)
        self.dec = msgspec.msgpack.Decoder(type=batch_type)

    def __enter__(self) -> "EventSubscriber":
        import time

        time.sleep(0.5)  # the subscription reaches the publisher
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.destroy(linger=0)

    def collect(self, keep, done, timeout: float = 15.0) -> list:
        import time

        got: list = []
        deadline = time.monotonic() + timeout
        while not done(got) and time.monotonic() < deadline:
            if self.sub.poll(200):
                topic, _, payload = self.sub.recv_multipart()
                got.extend((topic.decode(), ev) for ev in self.dec.decode(payload).events if keep(ev))
        return got
