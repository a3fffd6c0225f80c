"""SGLang HiCache L3 storage backend over dfkv.

Load it with::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "dfkv",
        "module_path": "dfkv.connectors.sglang_hicache", "class_name": "DfkvHiCacheStorage",
        "interface_v1": 1, "members": "n1=10.0.0.10:12000,n2=10.0.0.11:12000"}'

SGLang's ``StorageBackendFactory`` imports the module and constructs
``DfkvHiCacheStorage(storage_config, kwargs)``; the cache controller then calls
``register_mem_pool_host`` with the host KV pool. With ``interface_v1`` the controller uses
the zero-copy ``batch_get_v1`` / ``batch_set_v1``: the page addresses come from the host
pool's ``get_page_buffer_meta`` and go straight to ``dfkv_batch_put_sg`` /
``dfkv_batch_get_auto_sg`` — one dfkv object per page, its K and V (and, in the layer-first
layout, every layer's) segments gathered into that one object, with no Python-level copy.

Identity: the namespace carries tenant, model, revision, the layout id
``sglang-hicache/raw-v1``, the KV dtype, a fingerprint of the host pool's page layout, the
page geometry and the topology sizes; each key carries the pool name, SGLang's page hash, the
tp/pp/attention-cp/dcp coordinates and the segment geometry (``dfkv.identity``). MLA models
store one object per page shared by every TP rank (tp rank = replicated) and only the storage
writer (TP rank 0, or the DCP writer) writes. Pools that stay TP-sharded under MLA (Mamba
state) keep their rank.

RDMA rail affinity (``"rail_affinity": 1``; docs/CONNECTORS.md): each worker process uses
the RDMA rail of its *physical* rank, ``rank % len(rails)``, plus
``rail_affinity_fallbacks`` neighbour rails (default 1; 0 = the one rail only) for when that
rail is quarantined, and no NUMA-based selection. The physical rank is the process's place
among SGLang's GPU workers, ``pp_rank * tp_size + tp_rank`` in SGLang's *global* parallel
context — not the storage config's ``tp_rank``, which is attention-TP-local and so 0 in every
process under DP attention. Without a live SGLang context it is rebuilt from the storage
config with SGLang's own layout rule, ``(dp_rank * attn_cp_size + attn_cp_rank) * tp_size +
tp_rank`` (with ``dp_rank`` 0 the config's ``tp_rank`` is taken as is: without DP attention
it is already global); ``rail_affinity_rank`` overrides both. The rails are
``rail_affinity_devices`` (list or comma string), else ``DFKV_RDMA_DEV``, else the devices
in /sys/class/infiniband. The choice reaches libdfkv as ``DFKV_RDMA_DEV`` (the chosen rails,
primary first), ``DFKV_RDMA_PRIMARY_DEV`` and ``DFKV_RDMA_NUMA=0``, with ``DFKV_RDMA_TIERS``
cleared (one tier, the primary preferred: a fallback carries traffic only while the primary
is unusable). ``rdma_depth`` (every connector) sets the RDMA depth, which is also how many
depth-1 SG-lane connections one batch of pages fans out over.

Failure model: every method returns a result of the documented type (never None where a list
is expected) and never raises into the engine; an unreachable node, a missing key, or a
value of the wrong size is a miss.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

try:  # multi-pool (v2) types; absent in older SGLang releases
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransferResult
except ImportError:  # pragma: no cover - depends on the installed SGLang
    PoolHitPolicy = PoolName = PoolTransferResult = None  # type: ignore[assignment]

from .. import identity
from ._common import (
    ClientConfig,
    LazyClient,
    _as_bool,
    addresses_segments,
    check_object_size,
    build_namespace,
    dtype_name,
    fingerprint,
    get_segments,
    leading_hits,
    page_hash_bytes,
    put_segments,
    safe_call,
)

__all__ = ["DfkvHiCacheStorage", "LAYOUT_ID", "physical_rank", "rail_affinity_env"]

logger = logging.getLogger("dfkv.connectors.sglang")

LAYOUT_ID = "sglang-hicache/raw-v1"
KV_POOL = "kv"


@dataclass
class _PoolGeom:
    """How one host pool's pages become dfkv objects."""

    name: str
    pool: Any
    page_tokens: int  # tokens per storage page (len(host_indices) per key)
    seg_sizes: Tuple[int, ...]  # bytes of each segment of one page, in gather order
    sharded: bool  # True: every rank has its own object; False: one shared object (MLA)
    key: Callable[[Any], bytes]  # page hash -> dfkv key

    @property
    def page_bytes(self) -> int:
        return sum(self.seg_sizes)


def _int_key(extra: Mapping[str, Any], name: str, default: int, lo: int = 0) -> int:
    v = extra.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, bool) or int(v) != float(v) or int(v) < lo:
        raise ValueError(f"dfkv HiCache: {name}={v!r}: want an integer >= {lo}")
    return int(v)


def physical_rank(sc: Any, extra: Optional[Mapping[str, Any]] = None) -> int:
    """The worker's physical rank for rail affinity (see the module docstring):
    ``rail_affinity_rank`` when set; else SGLang's live global parallel context
    (``pp_rank * tp_size + tp_rank``); else the storage config through SGLang's layout rule
    ``tp_rank == (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank``
    (under DP attention the config's tp_rank/tp_size are the attention-TP ones and dp_rank
    the attention-DP rank; with dp_rank 0 the config's tp_rank is taken as is, since
    without DP attention it is already global — the live context settles the case of DP
    attention with attention CP, where the config alone is ambiguous)."""
    extra = extra or {}
    if extra.get("rail_affinity_rank") not in (None, ""):
        return _int_key(extra, "rail_affinity_rank", 0)
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        tp_rank, tp_size, pp_rank = int(par.tp_rank), int(par.tp_size), int(par.pp_rank)
        if 0 <= tp_rank < tp_size and pp_rank >= 0:
            return pp_rank * tp_size + tp_rank
    except Exception:  # no published SGLang context in this process (tests, other launchers)
        pass
    g = lambda name, default: int(getattr(sc, name, default) or default) if sc is not None else default  # noqa: E731
    tp_rank, tp_size = g("tp_rank", 0), max(1, g("tp_size", 1))
    cp_rank, cp_size = g("attn_cp_rank", 0), max(1, g("attn_cp_size", 1))
    dp_rank = g("dp_rank", 0)
    if dp_rank == 0:
        return tp_rank
    return (dp_rank * cp_size + cp_rank) * tp_size + tp_rank


def _split(v: Any) -> List[str]:
    if v is None:
        return []
    items = v.split(",") if isinstance(v, str) else [str(x) for x in v]
    return [x.strip() for x in items if x.strip()]


def _sysfs_rails() -> List[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def rail_affinity_env(rank: int, rails: Sequence[str], fallbacks: int = 1) -> Dict[str, str]:
    """The libdfkv environment that pins a worker of physical ``rank`` to rail
    ``rails[rank % len(rails)]`` with ``fallbacks`` neighbour rails after it (at most every
    other rail; 0 = that rail alone) and NUMA selection off. The chosen rails form one tier
    with the primary preferred (the library uses a fallback only while the primary is
    unusable), so DFKV_RDMA_TIERS is cleared: tiers ranking other rails would override the
    affinity."""
    rails = list(rails)
    if not rails:
        raise ValueError("dfkv HiCache: rail_affinity needs the rails (rail_affinity_devices or DFKV_RDMA_DEV)")
    if len(set(rails)) != len(rails):
        raise ValueError(f"dfkv HiCache: rail list {rails} names a rail twice")
    if rank < 0 or fallbacks < 0:
        raise ValueError(f"dfkv HiCache: rank {rank} / rail_affinity_fallbacks {fallbacks} must be >= 0")
    n = len(rails)
    chosen = [rails[(rank + k) % n] for k in range(min(fallbacks, n - 1) + 1)]
    return {"DFKV_RDMA_DEV": ",".join(chosen), "DFKV_RDMA_PRIMARY_DEV": chosen[0], "DFKV_RDMA_NUMA": "0",
            "DFKV_RDMA_TIERS": ""}


def _arange(n: int) -> Any:
    try:
        import torch

        return torch.arange(n, dtype=torch.int64)
    except ImportError:  # pragma: no cover - SGLang always has torch
        import numpy as np

        return np.arange(n, dtype=np.int64)


class DfkvHiCacheStorage(HiCacheStorage):
    """HiCache L3 backend storing each page as one raw dfkv object."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[Mapping[str, Any]] = None):
        sc = storage_config
        extra = dict(kwargs or {}) if isinstance(kwargs, Mapping) else {}
        extra.update(getattr(sc, "extra_config", None) or {})
        self.storage_config = sc
        self.cfg = ClientConfig.from_mapping(extra)
        self.cfg.require_endpoints("dfkv HiCache backend")
        self.skip_existing = str(extra.get("skip_existing", "1")).lower() not in ("0", "false", "no")
        # The controller stores through batch_set_v1 (one gathered object per page) when the
        # dynamic backend's extra config sets interface_v1, else through batch_set (the flat
        # data page): lookups must probe the key form that interface stores.
        self.interface_v1 = bool(_as_bool(extra.get("interface_v1", 0)))

        g = lambda name, default: getattr(sc, name, default) if sc is not None else default  # noqa: E731
        self.tp_rank, self.tp_size = int(g("tp_rank", 0)), int(g("tp_size", 1))
        self.pp_rank, self.pp_size = int(g("pp_rank", 0)), int(g("pp_size", 1))
        self.cp_rank, self.cp_size = int(g("attn_cp_rank", 0)), int(g("attn_cp_size", 1))
        self.dcp_rank, self.dcp_size = int(g("dcp_rank", 0)), int(g("dcp_size", 1))
        self.is_mla = bool(g("is_mla_model", False))
        writer = getattr(sc, "is_storage_writer", None) if sc is not None else None
        if writer is None:
            writer = (not self.is_mla) or self.tp_rank == 0
        self.is_writer = bool(writer)
        self.model = self.cfg.model or g("model_name", None) or "unknown-model"

        # RDMA rail affinity: this worker's rail by its physical rank (module docstring).
        self.rail_rank: Optional[int] = None
        self.rail_env: Dict[str, str] = {}
        if _as_bool(extra.get("rail_affinity", 0)):
            rails = _split(extra.get("rail_affinity_devices")) or _split(os.environ.get("DFKV_RDMA_DEV")) \
                or _sysfs_rails()
            self.rail_rank = physical_rank(sc, extra)
            self.rail_env = rail_affinity_env(self.rail_rank, rails,
                                              _int_key(extra, "rail_affinity_fallbacks", 1))
            if os.environ.get("DFKV_RDMA_TIERS", "").strip():
                logger.warning("dfkv HiCache: rail_affinity replaces DFKV_RDMA_TIERS=%s in this process",
                               os.environ["DFKV_RDMA_TIERS"])
            self.cfg.lib_env.update(self.rail_env)
            logger.info("dfkv HiCache: rail affinity: physical rank %d (tp_rank %d, dp_rank %d) -> "
                        "rails %s, NUMA selection off", self.rail_rank, self.tp_rank,
                        int(g("dp_rank", 0) or 0), self.rail_env["DFKV_RDMA_DEV"])

        self.mem_pool_host: Any = None
        self.registered_pools: Dict[str, Any] = {}
        self._geoms: Dict[str, _PoolGeom] = {}
        self._flat_key = self._key_fn(KV_POOL, "flat", sharded=not self.is_mla, sg=None)
        self._client = LazyClient(self.cfg, self._namespace(None), name=f"sglang-hicache[tp{self.tp_rank}]")
        self._mem_client: Any = None  # the client the host pools were registered with
        self._mem_regs: List[Tuple[int, int]] = []  # (address, bytes) registered with it
        logger.info("dfkv HiCache backend: model=%s tp=%d/%d pp=%d/%d mla=%s writer=%s",
                    self.model, self.tp_rank, self.tp_size, self.pp_rank, self.pp_size,
                    self.is_mla, self.is_writer)

    # -- identity ---------------------------------------------------------------------------

    def _namespace(self, kv: Optional[_PoolGeom]) -> bytes:
        pool = kv.pool if kv is not None else None
        desc = {
            "layout": getattr(pool, "layout", None),
            "segments": list(kv.seg_sizes) if kv else [],
            "page_tokens": kv.page_tokens if kv else 0,
            **{a: getattr(pool, a, None) for a in ("layer_num", "head_num", "head_dim",
                                                    "kv_lora_rank", "qk_rope_head_dim")},
        }
        return build_namespace(
            tenant=self.cfg.tenant, model=self.model, revision=self.cfg.revision, layout=LAYOUT_ID,
            dtype=dtype_name(getattr(pool, "dtype", None)),
            fingerprint=fingerprint(desc) if kv else b"",
            page_tokens=max(1, kv.page_tokens if kv else 1),
            page_bytes=kv.page_bytes if kv else 0,
            geometry={"segments": len(kv.seg_sizes)} if kv else {},
            # MLA pages are the same on every TP rank (and TP size), so TP stays out.
            tp=1 if self.is_mla else self.tp_size, pp=self.pp_size, pcp=self.cp_size,
            dcp=self.dcp_size)

    def _key_fn(self, pool: str, component: str, sharded: bool,
                sg: Optional[identity.ScatterGather]) -> Callable[[Any], bytes]:
        build = identity.key_builder(
            pool=pool, component=component,
            tp=(self.tp_size, self.tp_rank) if sharded else (1, identity.REPLICATED),
            pp=(self.pp_size, self.pp_rank), pcp=(self.cp_size, self.cp_rank),
            dcp=(self.dcp_size, self.dcp_rank), sg=sg)
        return lambda h: build(page_hash_bytes(h))

    def _geometry(self, name: str, pool: Any) -> Optional[_PoolGeom]:
        """Probe the pool's page layout with the addresses of its first page."""
        page_tokens = int(getattr(pool, "logical_page_size", None) or getattr(pool, "page_size", 1) or 1)
        meta = pool.get_page_buffer_meta(_arange(page_tokens))
        if not meta:
            logger.warning("dfkv HiCache: pool %r has no page buffer metadata; zero-copy "
                           "transfers are unavailable for it", name)
            return None
        ptrs, sizes = meta
        if not sizes or len(ptrs) != len(sizes):
            return None
        sizes = tuple(int(s) for s in sizes)
        sharded = (not self.is_mla) or "mamba" in str(name).lower()
        uniform = len(set(sizes)) == 1
        sg = identity.ScatterGather(0, len(sizes), sizes[0]) if uniform else None
        component = ("latent" if self.is_mla else "kv") if str(name) == KV_POOL else "state"
        return _PoolGeom(name=str(name), pool=pool, page_tokens=page_tokens, seg_sizes=sizes,
                         sharded=sharded, key=self._key_fn(str(name), component, sharded, sg))

    # -- registration -----------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        geom = safe_call("HiCache page-layout probe", None, self._geometry, KV_POOL, mem_pool_host)
        if geom is not None:
            self._geoms[KV_POOL] = geom
        self._client.set_namespace(self._namespace(geom))
        if geom is not None:
            check_object_size(self._client, geom.page_bytes, "dfkv HiCache: one KV page object",
                              "use a smaller --page-size")

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[str(host_pool_name)] = host_pool
        if str(host_pool_name) == KV_POOL and self.mem_pool_host is None:
            self.register_mem_pool_host(host_pool)
            return
        geom = safe_call("HiCache page-layout probe", None, self._geometry, host_pool_name, host_pool)
        if geom is not None:
            self._geoms[str(host_pool_name)] = geom

    def _client_for_io(self) -> Any:
        """The client, with the host pools' buffers registered (``dfkv_register_memory``)
        once per client: over RDMA, pages then move straight from and into the pools through
        their registrations (no per-op registration or staging copy); a no-op on TCP."""
        c = self._client.get()
        if c is None or c is self._mem_client:
            return c
        self._mem_client, self._mem_regs = c, []
        pools = dict(self.registered_pools)
        if self.mem_pool_host is not None:
            pools.setdefault(KV_POOL, self.mem_pool_host)
        for name, pool in pools.items():
            for buf in _pool_buffers(pool):
                nbytes = buf.numel() * buf.element_size()
                if not nbytes:
                    continue
                if safe_call("HiCache register_memory", False, c.register_memory, buf.data_ptr(), nbytes):
                    self._mem_regs.append((buf.data_ptr(), nbytes))
                else:
                    logger.warning("dfkv HiCache: host pool %r (%d bytes) not registered for RDMA: %s",
                                   name, nbytes, c.last_error())
        return c

    def _geom(self, name: Any) -> Optional[_PoolGeom]:
        name = str(name)
        geom = self._geoms.get(name)
        if geom is None and name in self.registered_pools:
            geom = safe_call("HiCache page-layout probe", None, self._geometry, name,
                             self.registered_pools[name])
            if geom is not None:
                self._geoms[name] = geom
        return geom

    # -- zero-copy v1 ---------------------------------------------------------------------------

    def _segments(self, geom: _PoolGeom, host_indices: Any, n: int) -> List[List[Any]]:
        if len(host_indices) != n * geom.page_tokens:
            raise ValueError(f"{len(host_indices)} host indices for {n} pages of {geom.page_tokens} tokens")
        ptrs, sizes = geom.pool.get_page_buffer_meta(host_indices)
        segs = addresses_segments(ptrs, sizes, n)
        for s in segs:
            if tuple(b.nbytes for b in s) != geom.seg_sizes:
                raise ValueError("page buffer metadata does not match the registered page layout")
        return segs

    def _io_set(self, geom: Optional[_PoolGeom], keys: List[Any], host_indices: Any) -> List[bool]:
        n = len(keys)
        if geom is None:
            return [False] * n
        if not (self.is_writer or geom.sharded):
            return [True] * n  # MLA: another rank writes this shared page
        c = self._client_for_io()
        if c is None:
            return [False] * n
        dkeys = [geom.key(k) for k in keys]
        todo = list(range(n))
        out = [False] * n
        if self.skip_existing:
            for i, ex in enumerate(c.batch_exist(dkeys)):
                out[i] = ex
            todo = [i for i in range(n) if not out[i]]
        if todo:
            segs = self._segments(geom, host_indices, n)
            oks = put_segments(c, [dkeys[i] for i in todo], [segs[i] for i in todo])
            for i, ok in zip(todo, oks):
                out[i] = ok
            if geom.name == KV_POOL:  # the sidecar pools' pages share the KV page's hash
                safe_call("HiCache tag", None, self._tag_pages, c, keys, dkeys,
                          [i for i, ok in zip(todo, oks) if ok], geom.page_tokens)
        return out

    def _tag_pages(self, c: Any, keys: List[Any], dkeys: List[bytes], stored: List[int], page_tokens: int) -> None:
        """Attach SGLang's block hash to every stored page, as SGLang's own KV events carry
        it (``hash_str_to_int64`` of the page hash; docs/EVENTS.md): a node with --kv-events
        then publishes BlockStored/BlockRemoved for it. The keys of one call are a page chain
        (the controller slices a node's hash chain), so page i's parent is page i-1. Pages
        stored under an extra key or cache salt publish SGLang's storage hash, which SGLang
        namespaces differently in its own events. Best effort, like every tag."""
        import dfkv

        hs = [_event_hash(k) for k in keys]
        tags = []
        for i in stored:
            parent = hs[i - 1] if i > 0 and type(hs[i - 1]) is type(hs[i]) else None
            tags.append(dfkv.Tag(key=dkeys[i], block_hashes=[hs[i]], parent=parent, model=self.model,
                                 block_size=page_tokens))
        if tags:
            c.tag(tags)

    def _io_get(self, geom: Optional[_PoolGeom], keys: List[Any], host_indices: Any) -> List[bool]:
        n = len(keys)
        if geom is None:
            return [False] * n
        c = self._client_for_io()
        if c is None:
            return [False] * n
        segs = self._segments(geom, host_indices, n)
        return get_segments(c, [geom.key(k) for k in keys], segs)

    def _anchor(self) -> bool:
        """DeepSeek-V4's KV pool is a logical anchor (``kv_buffer`` None): it owns indices but
        no bytes; its sidecar pools carry the data (v2). Like Mooncake's backend, the anchor's
        own pages always 'transfer'."""
        return self.mem_pool_host is not None and getattr(self.mem_pool_host, "kv_buffer", True) is None

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        keys = list(keys or [])
        if not keys:
            return []
        if self._anchor():
            return [True] * len(keys)
        return safe_call("HiCache batch_get_v1", [False] * len(keys), self._io_get,
                         self._geoms.get(KV_POOL), keys, host_indices)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        keys = list(keys or [])
        if not keys:
            return []
        if self._anchor():
            return [True] * len(keys)
        return safe_call("HiCache batch_set_v1", [False] * len(keys), self._io_set,
                         self._geoms.get(KV_POOL), keys, host_indices)

    # -- existence ------------------------------------------------------------------------------

    def _exist_flags(self, geom: Optional[_PoolGeom], keys: List[Any]) -> List[bool]:
        c = self._client.get()
        if c is None or not keys:
            return [False] * len(keys)
        key = geom.key if geom is not None else self._flat_key
        return c.batch_exist([key(k) for k in keys])

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        keys = list(keys or [])
        if self._anchor():
            return len(keys)  # no KV bytes to miss: the sidecar pools decide (v2)
        geom = self._geoms.get(KV_POOL) if self.interface_v1 else None
        flags = safe_call("HiCache batch_exists", [], self._exist_flags, geom, keys)
        return leading_hits(flags)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- generic (copying) interface: target tensors / pointers ------------------------------------

    @staticmethod
    def _target(loc: Any, size: Any) -> Any:
        from .._buffers import RawBuffer

        if isinstance(loc, int) and not isinstance(loc, bool):
            return RawBuffer(loc, int(size))
        return loc

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        res = self.batch_get([key], None if target_location is None else [target_location],
                             None if target_sizes is None else [target_sizes])
        return res[0] if res else None

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        keys = list(keys or [])
        if not keys:
            return []

        def run() -> List[Any]:
            locs = list(target_locations) if target_locations is not None else [None] * len(keys)
            sizes = list(target_sizes) if target_sizes is not None else [None] * len(keys)
            for i, loc in enumerate(locs):
                if loc is None and self.mem_pool_host is not None:
                    locs[i] = self.mem_pool_host.get_dummy_flat_data_page()
            c = self._client.get()
            if c is None or any(loc is None for loc in locs):
                return [None] * len(keys)
            bufs = [self._target(loc, s) for loc, s in zip(locs, sizes)]
            hits = c.batch_get_into([self._flat_key(k) for k in keys], bufs)
            return [loc if ok else None for loc, ok in zip(locs, hits)]

        return safe_call("HiCache batch_get", [None] * len(keys), run)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        keys = list(keys or [])
        if not keys:
            return True
        if not self.is_writer:
            return True

        def run() -> bool:
            if values is not None:
                bufs = []
                for v in values:
                    if hasattr(v, "is_contiguous") and not v.is_contiguous():
                        v = v.contiguous()
                    bufs.append(v)
            elif target_locations is not None and target_sizes is not None:
                bufs = [self._target(loc, s) for loc, s in zip(target_locations, target_sizes)]
            else:
                return False
            c = self._client.get()
            if c is None:
                return False
            dkeys = [self._flat_key(k) for k in keys]
            oks = c.batch_put(dkeys, bufs)
            tokens = int(getattr(self.mem_pool_host, "page_size", 0) or 0)
            safe_call("HiCache tag", None, self._tag_pages, c, keys, dkeys,
                      [i for i, ok in enumerate(oks) if ok], tokens)
            return all(oks)

        return safe_call("HiCache batch_set", False, run)

    # -- multi-pool (v2) ------------------------------------------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        keys = list(keys or [])

        def run() -> Any:
            if self._anchor():
                kv_pages = len(keys)  # logical KV anchor: the sidecar pools carry the data
            else:  # v2 moves KV pages through batch_get_v2/batch_set_v2: the gathered form
                kv_pages = leading_hits(self._exist_flags(self._geoms.get(KV_POOL), keys))
            hit_count: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
            restorable = list(range(1, kv_pages + 1))
            transfers = list(pool_transfers or [])
            if not restorable or not transfers:
                return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)
            c = self._client.get()
            flat: List[bytes] = []
            spans = []
            for t in transfers:
                geom = self._geom(t.name)
                start = len(flat)
                if geom is not None:
                    flat.extend(geom.key(k) for k in keys[:kv_pages])
                spans.append((t, start, len(flat), geom is not None))
            ex = c.batch_exist(flat) if (c is not None and flat) else [False] * len(flat)
            for t, a, b, known in spans:
                if not restorable:
                    break
                page = list(ex[a:b]) if known else [False] * kv_pages
                policy = getattr(t, "hit_policy", PoolHitPolicy.ALL_PAGES)
                if policy == PoolHitPolicy.ALL_PAGES:
                    boundary = leading_hits(page)
                    allowed = set(range(1, boundary + 1))
                elif policy == PoolHitPolicy.TRAILING_PAGES:
                    window = max(1, len(t.keys) if t.keys else 1)
                    allowed = {p for p in range(1, kv_pages + 1)
                               if all(page[max(0, p - window):p])}
                    boundary = max(allowed, default=0)
                else:  # BLOCK_GROUPS: the pool's own verdict, never gating the KV hit
                    group = max(1, int(getattr(t, "group_pages", 0) or 1))
                    groups = 0
                    while (groups + 1) * group <= kv_pages and all(page[groups * group:(groups + 1) * group]):
                        groups += 1
                    if groups:
                        hit_count[t.name] = groups * group
                    continue
                if boundary:
                    hit_count[t.name] = boundary
                restorable = [p for p in restorable if p in allowed]
            return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)

        return safe_call("HiCache batch_exists_v2", PoolTransferResult(0, {}, []) if PoolTransferResult else None, run)

    def _batch_io_v2(self, transfers: Any, write: bool) -> Dict[Any, List[bool]]:
        results: Dict[Any, List[bool]] = {}
        for t in list(transfers or []):
            keys = list(t.keys or [])
            if not keys:
                results[t.name] = []
                continue
            pool = self.registered_pools.get(str(t.name))
            if str(t.name) == KV_POOL and getattr(self.mem_pool_host, "kv_buffer", True) is None:
                results[t.name] = [True] * len(keys)  # logical anchor, no bytes of its own
                continue
            geom = self._geom(t.name) if (pool is not None or str(t.name) == KV_POOL) else None
            fn = self._io_set if write else self._io_get
            what = "HiCache batch_set_v2" if write else "HiCache batch_get_v2"
            results[t.name] = safe_call(what, [False] * len(keys), fn, geom, keys, t.host_indices)
        return results

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> Dict[Any, List[bool]]:
        return safe_call("HiCache batch_get_v2", {}, self._batch_io_v2, transfers, False)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> Dict[Any, List[bool]]:
        return safe_call("HiCache batch_set_v2", {}, self._batch_io_v2, transfers, True)

    # -- lifecycle ------------------------------------------------------------------------------------

    def clear(self) -> None:
        # dfkv is a shared cache without enumeration: clearing is an operator action
        # (dfkvctl rm / server restart with a fresh --dir), never an engine side effect.
        logger.info("dfkv HiCache: clear() ignored (shared cache; remove keys with dfkvctl)")

    def get_stats(self) -> Any:
        return None

    def close(self) -> None:
        # The host pools belong to SGLang and outlive this backend: unregister them first.
        c = self._client.peek()
        if c is not None and c is self._mem_client:
            for addr, nbytes in self._mem_regs:
                if not safe_call("HiCache unregister_memory", False, c.unregister_memory, addr, nbytes):
                    logger.warning("dfkv HiCache: host pool range of %d bytes not unregistered: %s",
                                   nbytes, c.last_error())
        self._mem_regs = []
        self._mem_client = None
        self._client.close()

    @property
    def client(self) -> Any:
        """The open ``dfkv.Client`` (None before the first I/O); for tests and diagnostics."""
        return self._client.peek()


def _event_hash(key: Any) -> Any:
    """The block hash SGLang's KV events publish for a page hash (its own
    ``hash_str_to_int64``: the first 64 bits of the SHA-256 hex, as int64); a key that is
    not a hex digest is published as its bytes."""
    if isinstance(key, str):
        try:
            from sglang.srt.mem_cache.utils import hash_str_to_int64
        except ImportError:  # pragma: no cover - older SGLang: the same rule
            def hash_str_to_int64(h: str) -> int:
                v = int(h[:16], 16)
                return v - (1 << 64) if v >= 1 << 63 else v
        try:
            int(key[:16], 16)
            return hash_str_to_int64(key)
        except ValueError:
            pass
    return page_hash_bytes(key)


def _pool_buffers(pool: Any) -> List[Any]:
    """The contiguous tensors behind a host pool (``kv_buffer``; a list of them in split
    layouts), or none when the pool exposes no such buffer."""
    buf = getattr(pool, "kv_buffer", None)
    bufs = list(buf) if isinstance(buf, (list, tuple)) else [buf]
    return [b for b in bufs if hasattr(b, "data_ptr") and hasattr(b, "numel") and hasattr(b, "element_size")
            and (not hasattr(b, "is_contiguous") or b.is_contiguous())]
