"""vLLM KV connector (``KVConnectorBase_V1`` + ``SupportsHMA``) over dfkv.

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "DfkvConnector",
      "kv_connector_module_path": "dfkv.connectors.vllm_v1", "kv_role": "kv_both",
      "kv_connector_extra_config": {"members": "n1=10.0.0.10:12000,n2=10.0.0.11:12000"}}'

``KVConnectorFactory`` imports ``kv_connector_module_path`` and builds one instance per role.
Nothing blocks the scheduler thread and a vanished object never fails a request:

* **Lookup (scheduler)** — ``get_num_new_matched_tokens`` hands the request's dfkv keys (one
  per block, KV cache group and rank) to a lookup thread that runs one *leased* batch lookup
  (``dfkv_batch_exist_lease``) and returns ``None`` ("ask again") until the answer is in. A
  leased hit is protected from eviction on its server until it is read or ``lease_ms``
  (default 10 s) passes, so the load that follows finds it. A failed lookup (dead node,
  deadline) answers 0 and pauses lookups for ``lookup_cooldown_s``: a dead node costs one
  deadline, not one per step.
* **Load (worker, asynchronous)** — every hit is loaded asynchronously
  (``load_kv_async=True``): ``start_load_kv`` queues one job per request on a loader thread
  that reads the objects into a pinned host buffer registered with dfkv once
  (``dfkv_register_memory``) and copies the blocks that arrived whole into the paged KV
  cache; ``get_finished`` reports the request when its job is done.
* **Partial loads recompute** — a job reports how many leading blocks arrived
  (``build_connector_worker_meta``); the scheduler-side ``update_connector_output`` rewinds
  the request's computed tokens to that prefix before vLLM promotes it, so vLLM simply
  computes the rest. No block ids are reported as load errors (host staging; direct loads
  below do report them): that path fails the request
  under vLLM's default ``kv_load_failure_policy="fail"`` and raises with several KV cache
  groups (HMA). Both policies and hybrid models therefore recompute.
* **Save (worker)** — ``wait_for_save`` gathers the prompt blocks that became full this step
  straight into a second registered pinned buffer and stores them (``kv_role=kv_consumer``
  never saves; ``kv_producer`` never looks up).

One object = one paged block of one KV cache group on one rank: every layer of the group,
each layer's block in its logical (K/V-first) order, concatenated. MLA models store one object
per block shared by all TP ranks (tp rank = replicated), written by TP rank 0 only. At start
the connector checks one object against the servers' advertised max value size and refuses to
start, naming ``--max-msg``, when it does not fit.

Granularity follows vLLM's: hits, loads and saves go by vLLM's scheduler block
(``resolve_kv_cache_block_sizes``: ``block_size x dcp``, or the LCM of the groups' blocks), and
a group's paged block is keyed by the hash vLLM computed for the hash unit that ends it
(``hash_block_size``: the scheduler block, or the groups' GCD / ``prefix_match_unit``), the
hash that covers exactly the block's prefix. Under decode context parallelism each rank holds
its share of a block's tokens in its physical block: its object carries its DCP rank (MLA: one
object per DCP shard, written by TP rank = DCP rank), and a hit needs every rank's object.
Prefill context parallelism (PCP > 1) is refused with a warning (no hits, no saves).

**Direct GPU loads** (``kv_connector_extra_config: {"direct_gpu": true}``, docs/CONNECTORS.md):
loads skip the host buffer. At ``register_kv_caches`` every KV cache tensor's memory is
exported as a DMA-BUF (``dmabuf_exporter``, default ``dfkv._cuda.export_dmabuf``) and
registered with the client (``register_dmabuf``, the device pointer as iova); a load then
resolves each block's device addresses for every layer and issues one scatter-gather GET per
object into them, which the owner's server serves by RDMA WRITEs straight into the KV cache.
The object bytes are the same as the host-staging path stores and reads. A load that fails
(a vanished object, no RDMA to its owner, a registration refused by a client reopened after
start) is a hard load failure: its blocks are
reported through ``get_block_ids_with_load_errors`` (vLLM then fails the request, or
recomputes it under ``kv_load_failure_policy="recompute"``); there is no host-staging retry.
Saves still go through the host buffer. Layouts it cannot serve (several KV cache groups:
HMA/Mamba; a page-first (block-outermost) layout; a block that is not a few contiguous runs)
refuse at start, naming the layout, and so does a DMA-BUF registration the NIC refuses
(``dfkv.DirectUnsupported``, with the driver's errno): never a silent host-staging fallback.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from .. import identity
from ..errors import DirectUnsupported
from ._common import (
    ClientConfig,
    LazyClient,
    _as_bool,
    build_namespace,
    check_object_size,
    dtype_name,
    fingerprint,
    leading_hits,
    page_hash_bytes,
    safe_call,
)

__all__ = ["DfkvConnector", "DfkvConnectorMetadata", "DfkvWorkerMetadata", "LAYOUT_ID"]

logger = logging.getLogger("dfkv.connectors.vllm")

LAYOUT_ID = "vllm-v1/raw-v1"
_NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as the null block
_DMABUF_ALIGN = mmap.PAGESIZE  # cuMemGetHandleForAddressRange wants host-page-aligned ranges

# (storage base address, size, a tensor on it) -> (DMA-BUF fd the connector then owns, offset
# of the base address in it)
DmabufExporter = Callable[[int, int, torch.Tensor], Tuple[int, int]]


def export_cuda_dmabuf(ptr: int, size: int, tensor: torch.Tensor) -> Tuple[int, int]:
    """The default ``dmabuf_exporter``: a DMA-BUF fd for the CUDA memory [ptr, ptr+size)
    (exported page-aligned around it through ``dfkv._cuda``, the CUDA driver loaded at run
    time) and ptr's offset in it. Any other device is refused: inject an exporter for it."""
    dev = getattr(tensor, "device", None)
    if getattr(dev, "type", None) != "cuda":
        raise ValueError(
            f"dfkv vLLM connector: direct_gpu: the KV cache lives on {dev}, not on a CUDA device; "
            "direct loads need device memory that can be exported as a DMA-BUF")
    try:
        from .. import _cuda
    except ImportError as e:
        raise RuntimeError(f"dfkv vLLM connector: direct_gpu: dfkv._cuda is not available: {e}") from e
    lo = ptr - ptr % _DMABUF_ALIGN
    hi = -(-(ptr + size) // _DMABUF_ALIGN) * _DMABUF_ALIGN
    try:
        fd = _cuda.export_dmabuf(lo, hi - lo)
    except Exception as e:
        raise RuntimeError(
            f"dfkv vLLM connector: direct_gpu: cannot export the KV cache memory ({hi - lo} bytes at "
            f"0x{lo:x}) as a DMA-BUF: {type(e).__name__}: {e} (consumer GPUs refuse it: CUDA error 801)") from e
    return int(fd), ptr - lo


def _block_runs(t: torch.Tensor, bdim: int) -> List[Tuple[int, int]]:
    """(byte offset from the block's first element, bytes) of the contiguous memory runs that
    make up one block of t along bdim, in the logical (row-major) order the staging path
    copies them in (index_select(bdim).movedim(bdim, 0).reshape), adjacent runs merged."""
    es = t.element_size()
    shape = [n for d, n in enumerate(t.shape) if d != bdim]
    strides = [st for d, st in enumerate(t.stride()) if d != bdim]
    run, k = 1, len(shape)
    while k > 0 and (shape[k - 1] == 1 or strides[k - 1] == run):
        run *= shape[k - 1]
        k -= 1
    offs = [0]
    for n, st in zip(shape[:k], strides[:k]):
        offs = [o + i * st for o in offs for i in range(n)]
        if len(offs) > 1 << 16:
            break  # hopeless: refused by the segment limit
    out: List[Tuple[int, int]] = []
    for o in offs:
        if out and out[-1][0] + out[-1][1] == o * es:
            out[-1] = (out[-1][0], out[-1][1] + run * es)
        else:
            out.append((o * es, run * es))
    return out


@dataclass
class _Transfer:
    """Objects of one request to load or save, for its hit units ``[first, first + n_units)``
    (a unit is vLLM's scheduler block: ``sched_tokens`` tokens, whole blocks of every KV
    cache group). ``items`` holds one ``(block hash, group, paged block id, unit)`` per paged
    block: the hash is the one vLLM computed at the block's last hash unit, so a block is
    keyed by exactly the prefix it holds whatever granularity vLLM hashed at."""

    req_id: str
    first: int
    n_units: int
    items: List[Tuple[bytes, int, int, int]]


@dataclass
class DfkvConnectorMetadata(KVConnectorMetadata):
    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


@dataclass
class DfkvWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: per finished load, how many of its leading blocks arrived whole
    (the minimum over ranks after aggregation)."""

    loaded: Dict[str, int] = field(default_factory=dict)
    # direct loads: requests whose load had block errors on some rank (their next lookup
    # answers 0, so a retry recomputes instead of failing the same load again)
    failed: Set[str] = field(default_factory=set)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        out = dict(self.loaded)
        for rid, n in getattr(other, "loaded", {}).items():
            out[rid] = min(n, out.get(rid, n))
        return DfkvWorkerMetadata(loaded=out, failed=set(self.failed) | set(getattr(other, "failed", ()) or ()))


@dataclass
class _ReqState:
    request: Any
    block_ids: List[List[int]]
    saved: int  # units [0, saved) are in dfkv (hit or saved)
    n_prompt: int


@dataclass
class _Lookup:
    start: int                      # first unit looked up (the local prefix)
    fut: Optional[Future] = None    # in flight
    hits: Optional[int] = None      # leading units every rank holds, when done


class DfkvConnector(KVConnectorBase_V1, SupportsHMA):
    """dfkv as an external prefix cache for vLLM v1."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.cfg = ClientConfig.from_mapping(extra)
        self.cfg.require_endpoints("dfkv vLLM connector")
        self.staging_blocks = max(1, int(extra.get("staging_blocks", 64)))
        self.lease_ms = int(extra.get("lease_ms", 10_000))
        self.lookup_cooldown_s = float(extra.get("lookup_cooldown_s", 5.0))
        kv_role = str(getattr(ktc, "kv_role", None) or "kv_both")
        self.can_load = kv_role != "kv_producer"
        self.can_save = kv_role != "kv_consumer"
        direct = extra.get("direct_gpu")
        self.direct = bool(_as_bool(direct)) if direct is not None else False
        # Segments (RDMA targets) one direct GET may name: the servers' --rdma-max-targets
        # (default 128); the library's max_sg_segs caps it too.
        self.direct_max_segments = int(extra.get("direct_max_segments", 128))
        # The DMA-BUF seam (tests inject one for memfd-backed CPU stand-ins): see DmabufExporter.
        self.dmabuf_exporter: DmabufExporter = export_cuda_dmabuf
        # Per-stage figures (stats()): staged_* for the host-staging path, direct_* for direct
        # loads (resolve = block addresses, io = the GETs issued and waited for).
        self._stats: Dict[str, float] = {k: 0 for k in (
            "staged_loads", "staged_load_objects", "staged_load_bytes",
            "direct_loads", "direct_load_objects", "direct_load_bytes", "direct_load_failures",
            "direct_failed_blocks", "direct_resolve_s", "direct_io_s", "direct_registrations")}

        mc = getattr(vllm_config, "model_config", None)
        pc = getattr(vllm_config, "parallel_config", None)
        cc = getattr(vllm_config, "cache_config", None)
        # where vLLM records the resolved physical KV cache layout (a KVCacheLayout name; a
        # worker may learn it only after it was built, so direct mode checks again at start)
        self._layout_srcs = (cc, kv_cache_config)
        use_mla = extra.get("use_mla")
        self.use_mla = bool(_as_bool(use_mla) if use_mla is not None else getattr(mc, "use_mla", False))
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        model = self.cfg.model or getattr(mc, "served_model_name", None) or getattr(mc, "model", None)
        if isinstance(model, (list, tuple)):
            model = model[0] if model else None
        model = str(model or "unknown-model")
        self.model_label = model  # the KV events' model label (BlockStored topics)
        revision = self.cfg.revision or str(getattr(mc, "revision", None) or "")

        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        self.block_size = int(getattr(cc, "block_size", 0) or 0) or (
            int(groups[0].kv_cache_spec.block_size) if groups else 16)
        self.num_blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
        self.groups: List[Tuple[List[str], Any]] = [(list(g.layer_names), g.kv_cache_spec) for g in groups]
        # Decode context parallelism: a dcp-sharded group's paged block spans
        # block_size x dcp tokens, of which each DCP rank holds its own share (interleaved
        # by cp_kv_cache_interleave_size) in its physical block of the same id.
        self.dcp_size = int(getattr(pc, "decode_context_parallel_size", 1) or 1)
        self.pcp_size = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
        self.cp_interleave = int(getattr(pc, "cp_kv_cache_interleave_size", 1) or 1)
        self.group_dcp = [self.dcp_size if getattr(spec, "dcp_sharded", False) else 1
                          for _, spec in self.groups]
        self.group_tokens = [int(getattr(spec, "block_size", self.block_size)) * d
                             for (_, spec), d in zip(self.groups, self.group_dcp)]
        # vLLM's scheduler block (hits and computed tokens align to it: every group's blocks
        # whole) and the unit it hashed request.block_hashes at (block_size x dcp; the GCD
        # of the groups' blocks or cache_config.prefix_match_unit with several groups).
        self.sched_tokens = self.hash_tokens = math.lcm(*self.group_tokens) if groups else self.block_size
        if groups:
            try:
                from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

                self.sched_tokens, self.hash_tokens = resolve_kv_cache_block_sizes(
                    kv_cache_config, vllm_config)
            except Exception as e:  # an invalid config is vLLM's to report
                logger.debug("dfkv: cannot resolve vLLM's scheduler/hash block sizes: %s", e)
            # what the engine core resolved and handed every process, when present
            self.hash_tokens = int(getattr(kv_cache_config, "hash_block_size", None) or self.hash_tokens)
        self.enabled = bool(groups)
        if self.direct:
            self._check_direct_groups()
            self._check_direct_layout()
            # direct loads exist only over RDMA (the library's DFKV_RDMA, set before it opens)
            self.cfg.lib_env.setdefault("DFKV_RDMA", os.environ.get("DFKV_RDMA") or "1")
        if self.enabled and self.pcp_size > 1:
            # vLLM 0.33's scheduler runs with pcp_world_size=1 and its DCP group spans the
            # PCP axis then; which rank holds which tokens is not derivable here.
            self.enabled = False
            logger.warning("dfkv vLLM connector: prefill context parallelism "
                           "(prefill_context_parallel_size=%d) is not supported; the connector "
                           "reports no hits and saves nothing", self.pcp_size)
        bad = [(g, t) for g, t in enumerate(self.group_tokens)
               if t % self.hash_tokens or self.sched_tokens % t]
        if self.enabled and bad:
            # e.g. a Mamba group outside cache mode "align": vLLM then hashes at the scheduler
            # block, coarser than another group's block, and no hash names that block.
            self.enabled = False
            logger.warning("dfkv vLLM connector: vLLM hashes units of %d tokens and schedules "
                           "blocks of %d; KV cache group(s) %s have blocks of %s tokens, which "
                           "no hash unit ends; the connector reports no hits and saves nothing",
                           self.hash_tokens, self.sched_tokens, [g for g, _ in bad],
                           [t for _, t in bad])
        desc = {
            # a worker's UniformTypeKVCacheSpecs is described by its first layer's spec, as
            # vLLM hands the scheduler (generate_scheduler_kv_cache_config): both sides must
            # derive the same namespace
            "groups": [{"layers": len(names), "spec": type(spec).__name__,
                        "block_size": getattr(spec, "block_size", None),
                        "heads": getattr(spec, "num_kv_heads", None),
                        "head_size": getattr(spec, "head_size", None),
                        "head_size_v": getattr(spec, "head_size_v", None),
                        "dtype": dtype_name(getattr(spec, "dtype", None)),
                        "page_bytes": getattr(spec, "page_size_bytes", None),
                        "window": getattr(spec, "sliding_window", None)}
                       for names, spec in ((n, getattr(sp, "first_spec", sp)) for n, sp in self.groups)],
            "mla": self.use_mla,
            "group_tokens": self.group_tokens,
            "hash_tokens": self.hash_tokens,
            "sched_tokens": self.sched_tokens,
            "dcp_interleave": self.cp_interleave if self.dcp_size > 1 else 1,
        }
        first = getattr(self.groups[0][1], "first_spec", self.groups[0][1]) if self.groups else None
        first_dtype = getattr(first, "dtype", None)
        ns = build_namespace(
            tenant=self.cfg.tenant, model=model, revision=revision, layout=LAYOUT_ID,
            dtype=dtype_name(first_dtype), fingerprint=fingerprint(desc),
            page_tokens=max(1, self.sched_tokens), page_bytes=0,
            geometry={"groups": len(self.groups), "hash_tokens": self.hash_tokens,
                      "dcp_interleave": self.cp_interleave if self.dcp_size > 1 else 1},
            tp=1 if self.use_mla else self.tp_size, dcp=self.dcp_size, pp=self.pp_size)
        self._client = LazyClient(self.cfg, ns, name=f"vllm[{role.name.lower()}]")

        # scheduler-side state
        self._reqs: Dict[str, _ReqState] = {}
        self._requests: Dict[str, Any] = {}
        self._lookups: Dict[str, _Lookup] = {}
        self._load_start: Dict[str, int] = {}   # request -> computed tokens before its load
        self._pending_loads: List[_Transfer] = []
        self._lookup_pool: Optional[ThreadPoolExecutor] = None
        self._lookups_paused_until = 0.0
        self._kv_cache_manager: Any = None
        # worker-side state
        self._layers: List[List[Tuple[str, torch.Tensor, int, int]]] = []
        self._obj_bytes: List[int] = []
        self._load_buf: Optional[torch.Tensor] = None
        # buffer -> (client, address, bytes) registered
        self._buf_client: Dict[str, Tuple[int, int, int]] = {}
        self._save_buf: Optional[torch.Tensor] = None
        self._loader: Optional[ThreadPoolExecutor] = None
        self._load_jobs: Dict[str, Future] = {}
        self._loaded: Dict[str, int] = {}
        self._mu = threading.Lock()
        # direct loads: per group, per layer (block 0 address, block stride, runs of a block)
        self._direct_layers: List[List[Tuple[int, int, List[Tuple[int, int]]]]] = []
        self._dmabufs: Dict[int, Tuple[int, int, int]] = {}  # iova -> (size, fd, offset)
        self._dmabuf_client: Optional[int] = None  # id() of the client they are registered with
        self._dmabuf_error: Optional[str] = None   # why they are not (loads then fail)
        self._dmabuf_exc: Optional[BaseException] = None  # the exception that said so
        self._load_errors: Set[int] = set()        # failed block ids not yet reported
        self._job_blocks: Dict[str, Set[int]] = {}  # direct job -> its block ids (all fail if it raises)
        self._failed_reqs: Set[str] = set()  # worker: direct loads with errors, not yet reported
        self._no_load: Set[str] = set()      # scheduler: requests not to load again
        self.tp_rank, self.pp_rank, self.dcp_rank = self._ranks(extra)

    def _check_direct_groups(self) -> None:
        """direct_gpu serves one attention KV cache group: vLLM maps reported block ids back to
        requests only then (several groups raise in its scheduler), and recurrent state
        (Mamba) is not paged attention KV."""
        kinds = [type(getattr(spec, "first_spec", spec)).__name__ for _, spec in self.groups]
        if len(self.groups) > 1:
            raise ValueError(
                f"dfkv vLLM connector: direct_gpu does not serve hybrid KV cache layouts (HMA): "
                f"{len(self.groups)} KV cache groups ({', '.join(kinds)}); vLLM accepts block-level "
                "load errors for one group only. Use the host-staging path (direct_gpu: false)")
        for kind in kinds:
            if "mamba" in kind.lower() or "attention" not in kind.lower():
                raise ValueError(
                    f"dfkv vLLM connector: direct_gpu does not serve KV cache group spec {kind} "
                    "(recurrent / non-attention state); use the host-staging path (direct_gpu: false)")

    def _declared_layout(self) -> Optional[Any]:
        """vLLM's resolved physical KV cache layout (``KVCacheLayout``, vLLM >= 0.33), or None
        where it is not known (not resolved yet, an older vLLM, a name this vLLM lacks)."""
        try:
            from vllm.v1.kv_cache_layout import KVCacheLayout
        except ImportError:
            return None
        for src in self._layout_srcs:
            name = getattr(src, "kv_cache_layout", None)
            if isinstance(name, KVCacheLayout):
                return name
            if isinstance(name, str) and name in KVCacheLayout.__members__:
                return KVCacheLayout[name]
        return None

    def _check_direct_layout(self) -> None:
        """direct_gpu serves layer-first KV caches only: a page-first (block-outermost) layout,
        where every layer's page of a block is packed into one block row of a shared
        allocation (vLLM's BLHNC/BLNHC/BHLNC, what its NIXL connector calls a packed cache), is
        refused by name, as vLLM's own connectors detect it (``is_block_outermost``)."""
        lay = self._declared_layout()
        if lay is not None and getattr(lay, "is_block_outermost", False):
            raise ValueError(
                f"dfkv vLLM connector: direct_gpu does not serve page-first KV cache layouts: vLLM's "
                f"KV cache layout is {lay.name} (block-outermost: every layer's page of a block packed "
                "into one block row); direct loads address layer-first layouts only (L outermost, e.g. "
                "LBNHC, LBHNC). Use the host-staging path (direct_gpu: false) or a layer-first layout "
                "(VLLM_KV_CACHE_LAYOUT, where the attention backend supports it)")

    @staticmethod
    def _page_first_layers(group: List[Tuple[str, torch.Tensor, int, int]]) -> Optional[str]:
        """The same check from the tensors vLLM registered, for a layout whose name is not
        known: in a page-first layout the layers of a group interleave in one allocation (each
        layer's block stride spans the other layers' pages), so the memory spans of two layers
        overlap; layer-first layers each own a region (a layer sharing another's KV cache,
        vLLM's KV sharing, is the same view: not an interleave). Returns a description, or None."""
        spans = []
        for name, t, _, _ in group:
            es = t.element_size()
            lo = int(t.data_ptr())
            hi = lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) + 1) * es
            spans.append((int(t.untyped_storage().data_ptr()), lo, hi, name, t))
        spans.sort(key=lambda x: x[:2])
        for a, b in zip(spans, spans[1:]):
            same = (a[1], a[2], tuple(a[4].stride())) == (b[1], b[2], tuple(b[4].stride()))
            if a[0] == b[0] and b[1] < a[2] and not same:
                return (f"layers {a[3]} and {b[3]} interleave in one allocation (shape "
                        f"{tuple(a[4].shape)}, stride {tuple(a[4].stride())}, the next layer "
                        f"{b[1] - a[1]} bytes further)")
        return None

    def stats(self) -> Dict[str, float]:
        """A copy of the connector's per-stage figures (staged_* and direct_* counts, bytes and
        seconds)."""
        with self._mu:
            return dict(self._stats)

    def _count(self, **kw: float) -> None:
        with self._mu:
            for k, v in kw.items():
                self._stats[k] += v

    # -- identity ---------------------------------------------------------------------------

    def _ranks(self, extra: Dict[str, Any]) -> Tuple[int, int, int]:
        """This worker's tp/pp/dcp ranks from vLLM's process groups. ``tp_rank``/``pp_rank`` in
        the extra config count only where the groups do not exist (the scheduler process, or
        a test without torch.distributed); they never override a real group. Without a DCP
        group the DCP rank is vLLM's own relation for DCP over TP ranks: tp_rank % dcp."""
        try:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group

            tp, pp = int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)
        except Exception:  # groups not initialised
            tp, pp = int(extra.get("tp_rank") or 0), int(extra.get("pp_rank") or 0)
        dcp = tp % self.dcp_size
        if self.dcp_size > 1:
            try:
                from vllm.distributed.parallel_state import get_dcp_group

                dcp = int(get_dcp_group().rank_in_group)
            except Exception:  # group not initialised
                pass
        return tp, pp, dcp

    def _key(self, h: bytes, group: int, tp_rank: int, pp_rank: int, dcp_rank: int = 0) -> bytes:
        """The object of one paged block of a group on one rank. Under DCP a dcp-sharded
        group's block differs per DCP rank (each holds its share of the block's tokens), so
        the DCP coordinate is part of the key; MLA's latent is the same on every TP rank of
        one DCP rank, so TP stays replicated."""
        sharded = group < len(self.group_dcp) and self.group_dcp[group] > 1
        return identity.encode_object_key(
            pool="kv", page_hash=page_hash_bytes(h), component="latent" if self.use_mla else "kv",
            tp=(1, identity.REPLICATED) if self.use_mla else (self.tp_size, tp_rank),
            dcp=(self.dcp_size, dcp_rank) if sharded else (1, 0),
            pp=(self.pp_size, pp_rank), cache_group=group)

    def _rank_coords(self, group: int) -> List[Tuple[int, int, int]]:
        """(tp, pp, dcp) of every rank holding distinct bytes of a group's block: what a hit
        needs present. DCP reuses the TP ranks (dcp rank = tp rank % dcp); MLA ranks of one
        DCP rank hold the same latent, stored once."""
        d = self.group_dcp[group] if group < len(self.group_dcp) else 1
        if self.use_mla:
            pairs = [(r, r) for r in range(d)]  # the writer of DCP shard r is TP rank r
        else:
            pairs = [(t, t % d) for t in range(self.tp_size)]
        return [(t, p, r) for t, r in pairs for p in range(self.pp_size)]

    def _writes(self, group: int) -> bool:
        """Whether this rank stores its objects of a group (MLA: one writer per shard)."""
        if not self.use_mla:
            return True
        d = self.group_dcp[group] if group < len(self.group_dcp) else 1
        return self.tp_rank == (self.dcp_rank if d > 1 else 0)

    def _plan(self, request: Any, block_ids: Sequence[Sequence[int]], a: int, b: int,
              rid: Optional[str] = None) -> _Transfer:
        """The transfer of units [a, b): every group's paged blocks in them, each paired with
        the hash vLLM computed at the block's last hash unit (the hash chains over the whole
        prefix, as vLLM's BlockHashListWithBlockSize uses it)."""
        hashes = request.block_hashes
        items = []
        for g, gt in enumerate(self.group_tokens):
            per = self.sched_tokens // gt
            ids = block_ids[g] if g < len(block_ids) else ()
            for i in range(a * per, min(b * per, len(ids))):
                hi = (i + 1) * gt // self.hash_tokens - 1
                if hi < len(hashes):
                    items.append((bytes(hashes[hi]), g, int(ids[i]), i // per))
        return _Transfer(rid or request.request_id, a, b - a, items)

    def _units_available(self, request: Any, n_tokens: int) -> int:
        """Whole units of the first n_tokens that vLLM has hashes for."""
        return min(n_tokens, len(request.block_hashes) * self.hash_tokens) // self.sched_tokens

    # ==============================
    # Scheduler side
    # ==============================

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self._kv_cache_manager = kv_cache_manager

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return safe_call("vLLM lookup", (0, False), self._lookup, request, num_computed_tokens)

    def _lookup(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        rid = request.request_id
        self._requests[rid] = request
        if not self.enabled or not self.can_load or rid in self._no_load:
            return 0, False
        S = self.sched_tokens
        # keep >= 1 prompt token to compute
        n_units = self._units_available(request, max(0, len(request.prompt_token_ids or []) - 1))
        start = num_computed_tokens // S
        if start >= n_units:
            return 0, False
        lk = self._lookups.get(rid)
        if lk is None or lk.start != start:
            if time.monotonic() < self._lookups_paused_until:
                return 0, False
            if self._lookup_pool is None:
                self._lookup_pool = ThreadPoolExecutor(1, thread_name_prefix="dfkv-lookup")
            keys = self._lookup_keys(request, start, n_units)
            lk = _Lookup(start, fut=self._lookup_pool.submit(self._leased_lookup, keys))
            self._lookups[rid] = lk
        if lk.hits is None:
            if not lk.fut.done():
                return None, False  # still looking: vLLM asks again next step
            try:
                lk.hits = lk.fut.result()
            except Exception as e:
                lk.hits = 0
                self._lookups_paused_until = time.monotonic() + self.lookup_cooldown_s
                logger.warning("dfkv lookup failed; lookups answer 0 for %.1f s: %s: %s",
                               self.lookup_cooldown_s, type(e).__name__, e)
        tokens = (start + lk.hits) * S - num_computed_tokens
        return (tokens, True) if tokens > 0 else (0, False)

    def _lookup_keys(self, request: Any, start: int, end: int) -> List[List[bytes]]:
        """Per unit in [start, end): the keys of every group's blocks on every rank."""
        hashes = request.block_hashes
        out = []
        for u in range(start, end):
            keys = []
            for g, gt in enumerate(self.group_tokens):
                per = self.sched_tokens // gt
                coords = self._rank_coords(g)
                for i in range(u * per, (u + 1) * per):
                    h = bytes(hashes[(i + 1) * gt // self.hash_tokens - 1])
                    keys.extend(self._key(h, g, t, p, r) for t, p, r in coords)
            out.append(keys)
        return out

    def _leased_lookup(self, keys: List[List[bytes]]) -> int:
        c = self._client.get()
        if c is None:
            return 0
        flat = [k for ks in keys for k in ks]
        res = c.batch_exist_lease(flat, self.lease_ms)
        per = len(keys[0]) if keys else 0
        return leading_hits(all(v > 0 for v in res[i * per:(i + 1) * per]) for i in range(len(keys)))

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        safe_call("vLLM update_state_after_alloc", None, self._after_alloc, request, blocks,
                  num_external_tokens)

    def _after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        self._requests[rid] = request
        lk = self._lookups.pop(rid, None)
        if num_external_tokens <= 0 or lk is None or not lk.hits:
            return
        start = lk.start
        n = min(lk.hits, num_external_tokens // self.sched_tokens)
        if n <= 0:
            return
        ids = blocks.get_block_ids()
        self._pending_loads.append(self._plan(request, ids, start, start + n))
        self._load_start[rid] = start * self.sched_tokens
        st = self._reqs.get(rid)
        if st is not None:
            st.saved = max(st.saved, start + n)
        else:
            self._reqs[rid] = _ReqState(request, [list(g) for g in ids], start + n,
                                        len(request.prompt_token_ids or []))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = DfkvConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        if self.can_save:
            safe_call("vLLM build_connector_meta", None, self._collect_saves, scheduler_output, meta)
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        """Rewind a request whose load came back short to the prefix that arrived, before
        vLLM promotes it: vLLM then computes the rest itself (the recompute contract that
        holds under every ``kv_load_failure_policy`` and with several KV cache groups)."""
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        self._no_load |= set(getattr(meta, "failed", None) or ())
        for rid, ok_blocks in (getattr(meta, "loaded", None) or {}).items():
            req = self._requests.get(rid)
            base = self._load_start.pop(rid, None)
            if req is None or base is None:
                continue
            good = base + ok_blocks * self.sched_tokens
            if good >= req.num_computed_tokens:
                continue
            logger.info("dfkv: request %s loaded %d of %d tokens; vLLM recomputes the rest",
                        rid, good, req.num_computed_tokens)
            req.num_computed_tokens = good
            st = self._reqs.get(rid)
            if st is not None:
                st.saved = min(st.saved, good // self.sched_tokens)
            if good == 0 and self._kv_cache_manager is not None:
                # Nothing usable: release the blocks as vLLM does for a failed load with no
                # valid prefix, so that the retry starts from a fresh prefix lookup.
                self._kv_cache_manager.free(req)

    def _collect_saves(self, so: Any, meta: DfkvConnectorMetadata) -> None:
        if not self.enabled:
            return
        sched = getattr(so, "num_scheduled_tokens", {}) or {}
        for new in getattr(so, "scheduled_new_reqs", []) or []:
            rid = new.req_id
            st = self._reqs.get(rid)
            req = self._requests.get(rid)
            if req is None:
                continue
            if st is None:
                st = _ReqState(req, [], 0, len(new.prompt_token_ids or req.prompt_token_ids or []))
                self._reqs[rid] = st
            st.block_ids = [list(g) for g in new.block_ids]
            self._plan_save(rid, st, new.num_computed_tokens + int(sched.get(rid, 0)), meta)
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is None:
            return
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            if nb is not None:
                if rid in resumed:
                    st.block_ids = [list(g) for g in nb]
                else:
                    for g, more in enumerate(nb):
                        if g < len(st.block_ids):
                            st.block_ids[g].extend(more)
            self._plan_save(rid, st, cached.num_computed_tokens[i] + int(sched.get(rid, 0)), meta)

    def _plan_save(self, rid: str, st: _ReqState, computed_after: int, meta: DfkvConnectorMetadata) -> None:
        full = self._units_available(st.request, min(computed_after, st.n_prompt))
        if st.block_ids:
            full = min(full, *(len(ids) * gt // self.sched_tokens
                               for ids, gt in zip(st.block_ids, self.group_tokens)))
        else:
            full = 0
        if full <= st.saved:
            return
        meta.saves.append(self._plan(st.request, st.block_ids, st.saved, full, rid))
        st.saved = full

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self._forget(request.request_id)
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Tuple[List[int], ...]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self._forget(request.request_id)
        return False, None

    def _forget(self, rid: str) -> None:
        self._reqs.pop(rid, None)
        self._requests.pop(rid, None)
        self._lookups.pop(rid, None)
        self._load_start.pop(rid, None)
        self._no_load.discard(rid)

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        layers: List[List[Tuple[str, torch.Tensor, int, int]]] = []
        obj_bytes = []
        for names, spec in self.groups:
            group = []
            for name in names:
                t = kv_caches.get(name)
                if t is None:
                    continue  # another PP stage's layer
                t, bdim = self._as_blocks(name, t)
                lb = t.numel() // t.shape[bdim] * t.element_size()
                group.append((name, t, bdim, lb))
            layers.append(group)
            obj_bytes.append(sum(lb for *_, lb in group))
        self._layers, self._obj_bytes = layers, obj_bytes
        self._check_object_size()
        if self.direct:
            self._setup_direct()
        self._unregister_buf("load")
        self._unregister_buf("save")
        self._load_buf = self._save_buf = None
        logger.info("dfkv vLLM connector: %d layers in %d groups, object bytes %s, tp %d/%d",
                    sum(len(g) for g in layers), len(layers), obj_bytes, self.tp_rank, self.tp_size)

    def _setup_direct(self) -> None:
        """Direct loads: resolve every layer's block geometry (refusing layouts whose block is
        not a few contiguous runs, and page-first layouts), export each KV cache storage as a
        DMA-BUF once and register it with the client (again with a reopened client, at load
        time). A registration the client refuses here (the NIC cannot import DMA-BUFs:
        ``dfkv.DirectUnsupported`` with the driver's errno) refuses direct mode at start."""
        self._check_direct_layout()  # a worker may learn vLLM's resolved layout after __init__
        for group in self._layers:
            why = self._page_first_layers(group)
            if why is not None:
                raise ValueError(
                    f"dfkv vLLM connector: direct_gpu does not serve page-first KV cache layouts: {why}; "
                    "direct loads address layer-first layouts only (each layer's blocks in a region of "
                    "their own). Use the host-staging path (direct_gpu: false) or a layer-first layout")
        c = self._client.get()
        max_segs = min(self.direct_max_segments, c.max_sg_segs if c is not None else 256)
        direct: List[List[Tuple[int, int, List[Tuple[int, int]]]]] = []
        storages: Dict[int, Tuple[int, torch.Tensor]] = {}
        for g, group in enumerate(self._layers):
            per = []
            for name, t, bdim, lb in group:
                runs = _block_runs(t, bdim)
                if sum(n for _, n in runs) != lb:
                    raise ValueError(f"dfkv vLLM connector: direct_gpu: layer {name}: block runs of "
                                     f"{sum(n for _, n in runs)} bytes, expected {lb}")
                per.append((int(t.data_ptr()), int(t.stride(bdim)) * t.element_size(), runs))
                st = t.untyped_storage()
                storages.setdefault(int(st.data_ptr()), (int(st.nbytes()), t))
            segs = sum(len(r) for *_, r in per)
            if segs > max_segs:
                shapes = [(n, tuple(t.shape), tuple(t.stride())) for n, t, _, _ in group]
                raise ValueError(
                    f"dfkv vLLM connector: direct_gpu: KV cache layout {shapes} needs {segs} "
                    f"scatter-gather segments per block object (its block is not a few contiguous "
                    f"runs, e.g. a head-major/HND layout), more than the {max_segs} one direct GET "
                    f"may name (direct_max_segments, the servers' --rdma-max-targets, the "
                    f"library's max_sg_segs); use the host-staging path (direct_gpu: false)")
            direct.append(per)
        self._release_dmabufs()
        for iova, (size, t) in storages.items():
            fd, off = self.dmabuf_exporter(iova, size, t)
            self._dmabufs[iova] = (size, int(fd), int(off))
        self._direct_layers = direct
        if c is not None and self._ensure_dmabufs(c, at_start=True) is not None:
            err, exc = self._dmabuf_error, self._dmabuf_exc
            self._release_dmabufs()
            if isinstance(exc, DirectUnsupported):
                why = ("the RDMA NIC (or the client: no RDMA) refused to register the KV cache memory "
                       f"as a DMA-BUF ({err})")
            else:
                why = f"cannot register the KV cache memory as a DMA-BUF ({err})"
            raise RuntimeError(
                f"dfkv vLLM connector: direct_gpu: {why}; direct loads cannot work on this node. Use the "
                "host-staging path (direct_gpu: false), or a NIC and driver stack with DMA-BUF memory "
                "registration (ibv_reg_dmabuf_mr)") from exc
        logger.info("dfkv vLLM connector: direct_gpu: %d KV cache storage(s) exported as DMA-BUF, "
                    "segments per object %s", len(self._dmabufs), [sum(len(r) for *_, r in p) for p in direct])

    def _ensure_dmabufs(self, c: Any, at_start: bool = False) -> Optional[str]:
        """Register the exported KV cache memory with client c once; returns why it is not
        registered (None when it is). At start the caller raises with the reason; with a client
        reopened later, the loads through it fail."""
        if self._dmabuf_client == id(c):
            return self._dmabuf_error
        err, exc, done = None, None, []
        for iova, (size, fd, off) in self._dmabufs.items():
            try:
                c.register_dmabuf(fd, off, size, iova)
                self._count(direct_registrations=1)
                done.append((iova, size))
            except Exception as e:
                err, exc = f"register_dmabuf of {size} bytes at 0x{iova:x}: {type(e).__name__}: {e}", e
                if not at_start:
                    logger.error("dfkv vLLM connector: direct_gpu: %s; every direct load fails", err)
                break
        if err is not None:
            for iova, size in done:  # all or nothing: a failed registration leaves none behind
                try:
                    c.unregister_dmabuf(iova, size)
                except Exception as e:
                    logger.warning("dfkv vLLM connector: unregister_dmabuf of 0x%x: %s", iova, e)
        self._dmabuf_client, self._dmabuf_error, self._dmabuf_exc = id(c), err, exc
        return err

    def _release_dmabufs(self) -> None:
        c = self._client.peek()
        for iova, (size, fd, _) in self._dmabufs.items():
            if c is not None and self._dmabuf_client == id(c) and self._dmabuf_error is None:
                try:
                    c.unregister_dmabuf(iova, size)
                except Exception as e:
                    logger.warning("dfkv vLLM connector: unregister_dmabuf of 0x%x: %s", iova, e)
            try:
                os.close(fd)
            except OSError:
                pass
        self._dmabufs.clear()
        self._dmabuf_client = self._dmabuf_error = self._dmabuf_exc = None

    def _block_segments(self, group: int, block_id: int) -> List[Tuple[int, int]]:
        """(device address, bytes) of one block's object, in stored order: every layer of the
        group, each layer's runs."""
        return [(base + block_id * stride + off, n)
                for base, stride, runs in self._direct_layers[group] for off, n in runs]

    def _check_object_size(self) -> None:
        """Refuse to start when one block object exceeds what the servers accept: every PUT
        would fail, silently, for the life of the engine."""
        check_object_size(self._client, max(self._obj_bytes or [0]),
                          "dfkv vLLM connector: one KV block object (one paged block of every layer of "
                          "a KV cache group on this rank)", "use a smaller --block-size")

    def _as_blocks(self, name: str, t: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """A view of a layer's KV tensor with one dimension of ``num_blocks`` blocks, and that
        dimension. Accepted: (2, num_blocks, ...) (K/V first); any layout with a dimension of
        num_blocks; vLLM 0.33's [B, H, N, C] views where B = num_blocks x kernel split (a
        block's kernel blocks are consecutive rows) and raw byte buffers of num_blocks pages,
        both when contiguous. Anything else refuses at start, naming the layout."""
        nb = self.num_blocks
        shape = tuple(t.shape)
        if nb > 0:
            if t.dim() >= 2 and shape[0] == 2 and shape[1] == nb:
                return t, 1  # (2, num_blocks, ...): K/V split first
            if shape[0] == nb:
                return t, 0
            if t.dim() == 1 and t.numel() % nb == 0 and t.is_contiguous():
                return t.view(nb, t.numel() // nb), 0  # raw buffer: num_blocks pages of bytes
            if t.dim() >= 2 and shape[0] % nb == 0 and t.is_contiguous():
                return t.view((nb, shape[0] // nb) + shape[1:]), 0  # [B,H,N,C], B = nb x split
            for d, s in enumerate(shape):
                if s == nb:
                    return t, d
        raise ValueError(
            f"dfkv vLLM connector: layer {name}: KV tensor of shape {shape}, dtype {t.dtype}, "
            f"stride {tuple(t.stride())} has no dimension of num_blocks={nb} blocks, no contiguous "
            "leading dimension that is a multiple of it ([B,H,N,C] with B = num_blocks x kernel "
            "split), and is not a contiguous raw buffer of num_blocks pages; this layout is not "
            "supported")

    def _host_buf(self, which: str) -> torch.Tensor:
        """A host buffer of ``staging_blocks`` rows of the largest object, allocated once
        (pinned when CUDA is present, so device copies are DMA) and registered with dfkv
        once; loads and saves each have their own, as loads run on the loader thread."""
        buf = self._load_buf if which == "load" else self._save_buf
        width = max(self._obj_bytes or [0])
        if buf is None or buf.shape[1] < width:
            self._unregister_buf(which)  # before the old buffer can be freed
            pin = torch.cuda.is_available()
            buf = torch.empty((self.staging_blocks, width), dtype=torch.uint8, pin_memory=pin)
            if which == "load":
                self._load_buf = buf
            else:
                self._save_buf = buf
        # Registered with the client that moves it (again when the client was reopened).
        c = self._client.get()
        if c is not None and self._buf_client.get(which) != (id(c), buf.data_ptr(), buf.numel()):
            self._unregister_buf(which)
            if c.register_memory(buf.data_ptr(), buf.numel()):
                self._buf_client[which] = (id(c), buf.data_ptr(), buf.numel())
        return buf

    def _unregister_buf(self, which: str) -> None:
        """Undo the host buffer's registration with the client that holds it (dropped, or
        replaced by a larger one): freed memory must not stay registered."""
        reg = self._buf_client.pop(which, None)
        c = self._client.peek()
        if reg is not None and c is not None and id(c) == reg[0]:
            if not c.unregister_memory(reg[1], reg[2]):
                logger.warning("dfkv vLLM connector: %s buffer not unregistered: %s", which, c.last_error())

    def _gather(self, group: int, block_ids: Sequence[int], out: torch.Tensor) -> None:
        off = 0
        for _, t, bdim, lb in self._layers[group]:
            idx = torch.tensor(block_ids, dtype=torch.long, device=t.device)
            x = t.index_select(bdim, idx).movedim(bdim, 0).reshape(len(block_ids), -1)
            out[:, off:off + lb].copy_(x.contiguous().view(torch.uint8))
            off += lb

    def _scatter(self, group: int, block_ids: Sequence[int], rows: torch.Tensor) -> None:
        off = 0
        for _, t, bdim, lb in self._layers[group]:
            idx = torch.tensor(block_ids, dtype=torch.long, device=t.device)
            src = rows[:, off:off + lb].to(t.device).contiguous().view(t.dtype)
            view = t.movedim(bdim, 0)
            view[idx] = src.reshape((len(block_ids),) + tuple(view.shape[1:]))
            off += lb

    def _units(self, x: _Transfer) -> List[Tuple[bytes, int, int, int]]:
        """(dfkv key, group, block id, unit) per object of this rank, skipping null blocks."""
        out = []
        for h, g, bid, u in x.items:
            if g < len(self._layers) and bid != _NULL_BLOCK and self._obj_bytes[g] > 0:
                out.append((self._key(h, g, self.tp_rank, self.pp_rank, self.dcp_rank), g, bid, u))
        return out

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        loads = getattr(self._get_connector_metadata(), "loads", None) or []
        if not loads:
            return
        if self._loader is None:
            self._loader = ThreadPoolExecutor(1, thread_name_prefix="dfkv-load")
        for x in loads:
            if self.direct:
                self._job_blocks[x.req_id] = {bid for _, _, bid, _ in self._units(x)}
                self._load_jobs[x.req_id] = self._loader.submit(self._load_direct, x)
            else:
                self._load_jobs[x.req_id] = self._loader.submit(self._load_request, x)

    def _load_direct(self, x: _Transfer) -> Set[int]:
        """Load one request's blocks straight into the KV cache (RDMA into the registered
        device memory): one scatter-gather GET per object. Returns the block ids that did not
        arrive whole (hard load errors; nothing is retried through the host)."""
        units = self._units(x)
        t0 = time.perf_counter()
        c = self._client.get()
        why = "no dfkv client" if c is None else self._ensure_dmabufs(c)
        if why is not None:
            self._count(direct_loads=1, direct_load_failures=len(units), direct_failed_blocks=len(units))
            logger.warning("dfkv direct load of %s failed (%d blocks): %s", x.req_id, len(units), why)
            return {bid for _, _, bid, _ in units}
        segs = [self._block_segments(g, bid) for _, g, bid, _ in units]
        t1 = time.perf_counter()
        res = c.batch_get_auto_sg([k for k, _, _, _ in units], segs) if units else []
        t2 = time.perf_counter()
        bad = {bid for (_, g, bid, _), (hit, n) in zip(units, res) if not hit or n != self._obj_bytes[g]}
        got = sum(self._obj_bytes[g] for (_, g, _, _), (hit, n) in zip(units, res) if hit and n == self._obj_bytes[g])
        self._count(direct_loads=1, direct_load_objects=len(units) - len(bad), direct_load_bytes=got,
                    direct_load_failures=len(bad), direct_failed_blocks=len(bad),
                    direct_resolve_s=t1 - t0, direct_io_s=t2 - t1)
        if bad:
            logger.warning("dfkv direct load of %s: %d of %d blocks failed (%s)", x.req_id, len(bad),
                           len(units), c.last_error())
        return bad

    def _load_request(self, x: _Transfer) -> int:
        """Load one request's blocks; returns how many leading blocks arrived whole."""
        units = self._units(x)
        c = self._client.get()
        if c is None:
            return 0
        ok = [True] * x.n_units
        buf = self._host_buf("load")
        self._count(staged_loads=1)
        for s in range(0, len(units), self.staging_blocks):
            chunk = units[s:s + self.staging_blocks]
            bufs = [buf[i, : self._obj_bytes[g]] for i, (_, g, _, _) in enumerate(chunk)]
            hits = safe_call("vLLM load", [False] * len(chunk), c.batch_get_into,
                             [k for k, _, _, _ in chunk], bufs)
            for g in {g for _, g, _, _ in chunk}:
                rows = [i for i, u in enumerate(chunk) if u[1] == g and hits[i]]
                if rows:
                    self._scatter(g, [chunk[i][2] for i in rows], buf[rows, : self._obj_bytes[g]])
            for (_, _, _, u), hit in zip(chunk, hits):
                if not hit:
                    ok[u - x.first] = False
            self._count(staged_load_objects=sum(1 for h in hits if h),
                        staged_load_bytes=sum(self._obj_bytes[g] for (_, g, _, _), h in zip(chunk, hits) if h))
        if torch.cuda.is_available() and any(t.is_cuda for g in self._layers for _, t, _, _ in g):
            # The scatter kernels run on this thread's stream: the request is reported done
            # (and its blocks read by a forward) only once they finished.
            torch.cuda.current_stream().synchronize()
        return leading_hits(ok)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: vLLM does not schedule a request until it finished

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # every layer of a block is saved together in wait_for_save

    def wait_for_save(self) -> None:
        if not self.can_save or not self.has_connector_metadata():
            return
        saves = getattr(self._get_connector_metadata(), "saves", None) or []
        units = [u for x in saves for u in self._units(x) if self._writes(u[1])]
        if units:
            # The engine block hash of each object, for KV events (docs/EVENTS.md).
            hashes = {self._key(h, g, self.tp_rank, self.pp_rank, self.dcp_rank): h
                      for x in saves for h, g, _, _ in x.items}
            safe_call("vLLM save", None, self._save_units, units, hashes)

    def _tag_saved(self, c: Any, keys: List[bytes], ok: Sequence[bool], hashes: Dict[bytes, bytes]) -> None:
        """Attach vLLM's block hash to every stored object: a node with --kv-events then
        publishes BlockStored/BlockRemoved under it (hashes as vLLM's own events carry them,
        bytes unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). Best effort: a node without
        events attaches none, an older node refuses (logged once by the caller's safe_call)."""
        import dfkv

        try:
            from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as conv
        except ImportError:  # older vLLM: the hash is what it publishes
            conv = bytes
        tags = [dfkv.Tag(key=k, block_hashes=[conv(hashes[k])], model=self.model_label, block_size=self.hash_tokens)
                for k, good in zip(keys, ok) if good and k in hashes]
        if tags:
            c.tag(tags)

    def _save_units(self, units: List[Tuple[bytes, int, int, int]], hashes: Optional[Dict[bytes, bytes]] = None) -> None:
        c = self._client.get()
        if c is None:
            return
        buf = self._host_buf("save")
        for s in range(0, len(units), self.staging_blocks):
            chunk = units[s:s + self.staging_blocks]
            for g in {g for _, g, _, _ in chunk}:
                rows = [i for i, u in enumerate(chunk) if u[1] == g]
                lo, hi = rows[0], rows[-1] + 1
                if rows == list(range(lo, hi)):  # contiguous rows: gather straight in
                    self._gather(g, [chunk[i][2] for i in rows], buf[lo:hi, : self._obj_bytes[g]])
                else:
                    for i in rows:
                        self._gather(g, [chunk[i][2]], buf[i:i + 1, : self._obj_bytes[g]])
            keys = [k for k, _, _, _ in chunk]
            ok = c.batch_put(keys, [buf[i, : self._obj_bytes[g]] for i, (_, g, _, _) in enumerate(chunk)])
            if hashes:
                safe_call("vLLM tag", None, self._tag_saved, c, keys, ok, hashes)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        done = set()
        for rid, fut in list(self._load_jobs.items()):
            if fut.done():
                del self._load_jobs[rid]
                if self.direct:
                    # hard failures: the blocks go to get_block_ids_with_load_errors, reported
                    # no later than the step that reports the request finished
                    try:
                        bad = fut.result()
                    except Exception as e:
                        logger.warning("dfkv direct load of %s failed: %s", rid, e)
                        bad = self._job_blocks.get(rid, set())
                    self._job_blocks.pop(rid, None)
                    self._load_errors |= bad
                    if bad:
                        self._failed_reqs.add(rid)
                    done.add(rid)
                    continue
                try:
                    self._loaded[rid] = fut.result()
                except Exception as e:  # never raise into the model runner: recompute it
                    logger.warning("dfkv load of %s failed; vLLM recomputes it: %s", rid, e)
                    self._loaded[rid] = 0
                done.add(rid)
        return None, (done or None)

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        if not self._loaded and not self._failed_reqs:
            return None
        meta = DfkvWorkerMetadata(loaded=self._loaded, failed=self._failed_reqs)
        self._loaded, self._failed_reqs = {}, set()
        return meta

    def get_block_ids_with_load_errors(self) -> Set[int]:
        # host staging: short loads are reported through build_connector_worker_meta; direct
        # loads: the blocks of finished jobs that did not arrive (hard failures)
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        for pool in (self._loader, self._lookup_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._unregister_buf("load")
        self._unregister_buf("save")
        self._release_dmabufs()
        self._client.close()
