"""vLLM KV connector (``KVConnectorBase_V1`` + ``SupportsHMA``) over dfkv.

Load it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "DfkvConnector",
      "kv_connector_module_path": "dfkv.connectors.vllm_v1", "kv_role": "kv_both",
      "kv_connector_extra_config": {"members": "n1=10.0.0.10:12000,n2=10.0.0.11:12000"}}'

``KVConnectorFactory`` imports ``kv_connector_module_path`` and builds one instance per role:

* **Scheduler side** — ``get_num_new_matched_tokens`` turns the request's block hashes into
  dfkv keys (one per block, KV cache group and rank) and asks one batch EXIST how many blocks
  beyond the locally computed prefix every rank holds; ``update_state_after_alloc`` records
  which allocated blocks to load; ``build_connector_meta`` adds the prompt blocks that become
  full this step to the save list; ``request_finished[_all_groups]`` drops the request.
* **Worker side** — ``register_kv_caches`` learns each layer's paged tensor;
  ``start_load_kv`` reads the objects into a host staging buffer (pinned when CUDA is
  present) and copies only the blocks that arrived whole into the paged KV cache;
  ``wait_for_save`` gathers the saved blocks into the staging buffer and stores them.
  A block whose object is missing or the wrong size is never written: its id is returned by
  ``get_block_ids_with_load_errors`` and vLLM recomputes it.

One object = one block of one KV cache group on one rank: every layer of the group, each
layer's block in its logical (K/V-first) order, concatenated. MLA models store one object per
block shared by all TP ranks (tp rank = replicated), written by TP rank 0 only.

Without RDMA all KV moves through the staging buffer (``staging_blocks`` objects at a time).
Loads are synchronous (``wait_for_layer_load`` has nothing to wait for) and saves complete in
``wait_for_save``, so ``get_finished`` never holds blocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from .. import identity
from ._common import (
    ClientConfig,
    LazyClient,
    build_namespace,
    dtype_name,
    fingerprint,
    leading_hits,
    page_hash_bytes,
    safe_call,
)

__all__ = ["DfkvConnector", "DfkvConnectorMetadata", "LAYOUT_ID"]

logger = logging.getLogger("dfkv.connectors.vllm")

LAYOUT_ID = "vllm-v1/raw-v1"
_NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as the null block


@dataclass
class _Transfer:
    """Blocks of one request to load or save: block i has hash ``hashes[i]`` and, in KV
    cache group g, the paged block id ``block_ids[g][i]``."""

    req_id: str
    hashes: List[bytes]
    block_ids: List[List[int]]


@dataclass
class DfkvConnectorMetadata(KVConnectorMetadata):
    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    block_ids: List[List[int]]
    saved: int  # blocks [0, saved) are in dfkv (hit or saved)
    n_prompt: int


class DfkvConnector(KVConnectorBase_V1, SupportsHMA):
    """dfkv as an external prefix cache for vLLM v1."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.cfg = ClientConfig.from_mapping(extra)
        self.cfg.require_endpoints("dfkv vLLM connector")
        self.staging_blocks = max(1, int(extra.get("staging_blocks", 64)))

        mc = getattr(vllm_config, "model_config", None)
        pc = getattr(vllm_config, "parallel_config", None)
        cc = getattr(vllm_config, "cache_config", None)
        self.use_mla = bool(extra.get("use_mla", getattr(mc, "use_mla", False)))
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        model = self.cfg.model or getattr(mc, "served_model_name", None) or getattr(mc, "model", None)
        if isinstance(model, (list, tuple)):
            model = model[0] if model else None
        model = str(model or "unknown-model")
        revision = self.cfg.revision or str(getattr(mc, "revision", None) or "")

        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        self.block_size = int(getattr(cc, "block_size", 0) or 0) or (
            int(groups[0].kv_cache_spec.block_size) if groups else 16)
        self.num_blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
        self.groups: List[Tuple[List[str], Any]] = [(list(g.layer_names), g.kv_cache_spec) for g in groups]
        self.enabled = bool(groups) and all(
            int(getattr(spec, "block_size", self.block_size)) == self.block_size for _, spec in self.groups)
        if groups and not self.enabled:
            logger.warning("dfkv vLLM connector: KV cache groups with different block sizes are not "
                           "supported; the connector reports no hits and saves nothing")
        desc = {
            "groups": [{"layers": len(names), "spec": type(spec).__name__,
                        "block_size": getattr(spec, "block_size", None),
                        "heads": getattr(spec, "num_kv_heads", None),
                        "head_size": getattr(spec, "head_size", None),
                        "head_size_v": getattr(spec, "head_size_v", None),
                        "dtype": dtype_name(getattr(spec, "dtype", None)),
                        "page_bytes": getattr(spec, "page_size_bytes", None),
                        "window": getattr(spec, "sliding_window", None)}
                       for names, spec in self.groups],
            "mla": self.use_mla,
        }
        first_dtype = getattr(self.groups[0][1], "dtype", None) if self.groups else None
        ns = build_namespace(
            tenant=self.cfg.tenant, model=model, revision=revision, layout=LAYOUT_ID,
            dtype=dtype_name(first_dtype), fingerprint=fingerprint(desc),
            page_tokens=max(1, self.block_size), page_bytes=0,
            geometry={"groups": len(self.groups)},
            tp=1 if self.use_mla else self.tp_size, pp=self.pp_size)
        self._client = LazyClient(self.cfg, ns, name=f"vllm[{role.name.lower()}]")

        # scheduler-side state
        self._reqs: Dict[str, _ReqState] = {}
        self._requests: Dict[str, Any] = {}
        self._lookups: Dict[str, Tuple[int, int]] = {}
        self._pending_loads: List[_Transfer] = []
        # worker-side state
        self._layers: List[List[Tuple[str, torch.Tensor, int, int]]] = []
        self._obj_bytes: List[int] = []
        self._staging: Optional[torch.Tensor] = None
        self._failed: Set[int] = set()
        self.tp_rank, self.pp_rank = self._ranks(extra)

    # -- identity ---------------------------------------------------------------------------

    @staticmethod
    def _ranks(extra: Dict[str, Any]) -> Tuple[int, int]:
        tp = extra.get("tp_rank")
        pp = extra.get("pp_rank")
        if tp is None or pp is None:
            try:
                from vllm.distributed.parallel_state import get_pp_group, get_tp_group

                tp = get_tp_group().rank_in_group if tp is None else tp
                pp = get_pp_group().rank_in_group if pp is None else pp
            except Exception:  # groups not initialised (scheduler process, tests)
                pass
        return int(tp or 0), int(pp or 0)

    def _key(self, h: bytes, group: int, tp_rank: int, pp_rank: int) -> bytes:
        return identity.encode_object_key(
            pool="kv", page_hash=page_hash_bytes(h), component="latent" if self.use_mla else "kv",
            tp=(1, identity.REPLICATED) if self.use_mla else (self.tp_size, tp_rank),
            pp=(self.pp_size, pp_rank), cache_group=group)

    def _all_rank_keys(self, h: bytes) -> List[bytes]:
        tps = [0] if self.use_mla else range(self.tp_size)
        return [self._key(h, g, t, p) for t in tps for p in range(self.pp_size)
                for g in range(len(self.groups))]

    # ==============================
    # Scheduler side
    # ==============================

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        return safe_call("vLLM lookup", (0, False), self._lookup, request, num_computed_tokens)

    def _lookup(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        self._requests[request.request_id] = request
        if not self.enabled:
            return 0, False
        bs = self.block_size
        n_prompt = len(request.prompt_token_ids or [])
        hashes = list(request.block_hashes)[: max(0, n_prompt - 1) // bs]  # keep >= 1 token to compute
        start = num_computed_tokens // bs
        if start >= len(hashes):
            return 0, False
        c = self._client.get()
        if c is None:
            return 0, False
        per = len(self._all_rank_keys(hashes[0]))
        keys = [k for h in hashes[start:] for k in self._all_rank_keys(h)]
        ex = c.batch_exist(keys)
        hits = leading_hits(all(ex[i * per:(i + 1) * per]) for i in range(len(hashes) - start))
        self._lookups[request.request_id] = (start, start + hits)
        tokens = (start + hits) * bs - num_computed_tokens
        return max(0, tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        safe_call("vLLM update_state_after_alloc", None, self._after_alloc, request, blocks,
                  num_external_tokens)

    def _after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        self._requests[rid] = request
        start, end = self._lookups.pop(rid, (0, 0))
        if num_external_tokens <= 0:
            return
        n = min(end - start, num_external_tokens // self.block_size)
        if n <= 0:
            return
        ids = blocks.get_block_ids()
        hashes = [bytes(h) for h in list(request.block_hashes)[start:start + n]]
        self._pending_loads.append(_Transfer(rid, hashes, [list(g[start:start + n]) for g in ids]))
        st = self._reqs.get(rid)
        if st is not None:
            st.saved = max(st.saved, start + n)
        else:
            self._reqs[rid] = _ReqState(request, [list(g) for g in ids], start + n,
                                        len(request.prompt_token_ids or []))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = DfkvConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        safe_call("vLLM build_connector_meta", None, self._collect_saves, scheduler_output, meta)
        return meta

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
        hashes = list(st.request.block_hashes)
        full = min(computed_after, st.n_prompt) // self.block_size
        full = min(full, len(hashes), *(len(g) for g in st.block_ids)) if st.block_ids else 0
        if full <= st.saved:
            return
        a, b = st.saved, full
        meta.saves.append(_Transfer(rid, [bytes(h) for h in hashes[a:b]], [g[a:b] for g in st.block_ids]))
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
                bdim = self._block_dim(t)
                lb = t.numel() // t.shape[bdim] * t.element_size()
                group.append((name, t, bdim, lb))
            layers.append(group)
            obj_bytes.append(sum(lb for *_, lb in group))
        self._layers, self._obj_bytes = layers, obj_bytes
        self._staging = None
        logger.info("dfkv vLLM connector: %d layers in %d groups, object bytes %s, tp %d/%d",
                    sum(len(g) for g in layers), len(layers), obj_bytes, self.tp_rank, self.tp_size)

    def _block_dim(self, t: torch.Tensor) -> int:
        nb = self.num_blocks
        if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == nb:
            return 1  # (2, num_blocks, ...): K/V split first
        for d, s in enumerate(t.shape):
            if s == nb:
                return d
        raise ValueError(f"cannot find the block dimension ({nb} blocks) in a KV tensor of shape {tuple(t.shape)}")

    def _staging_rows(self, rows: int) -> torch.Tensor:
        """The host staging buffer: ``staging_blocks`` rows of the largest object, allocated
        once (pinned when CUDA is present, so device copies are DMA) and reused."""
        width = max(self._obj_bytes or [0])
        if self._staging is None or self._staging.shape[1] < width:
            pin = torch.cuda.is_available()
            self._staging = torch.empty((self.staging_blocks, width), dtype=torch.uint8, pin_memory=pin)
        assert rows <= self._staging.shape[0]
        return self._staging

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

    def _units(self, xfers: List[_Transfer]) -> List[Tuple[bytes, int, int]]:
        """(dfkv key, group, block id) per object of this rank, skipping null blocks."""
        out = []
        for x in xfers:
            for i, h in enumerate(x.hashes):
                for g in range(min(len(x.block_ids), len(self._layers))):
                    bid = x.block_ids[g][i] if i < len(x.block_ids[g]) else _NULL_BLOCK
                    if bid != _NULL_BLOCK and self._obj_bytes[g] > 0:
                        out.append((self._key(h, g, self.tp_rank, self.pp_rank), g, bid))
        return out

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        loads = getattr(meta, "loads", None) or []
        if not loads:
            return
        units = self._units(loads)
        ok = safe_call("vLLM load", None, self._load_units, units)
        if ok is None:  # unexpected failure: every block of these loads is suspect
            self._failed.update(bid for _, _, bid in units)

    def _load_units(self, units: List[Tuple[bytes, int, int]]) -> bool:
        c = self._client.get()
        for s in range(0, len(units), self.staging_blocks):
            chunk = units[s:s + self.staging_blocks]
            if c is None:
                self._failed.update(bid for _, _, bid in chunk)
                continue
            stg = self._staging_rows(len(chunk))
            bufs = [stg[i, : self._obj_bytes[g]] for i, (_, g, _) in enumerate(chunk)]
            hits = c.batch_get_into([k for k, _, _ in chunk], bufs)
            for g in {g for _, g, _ in chunk}:
                rows = [i for i, (_, gg, _) in enumerate(chunk) if gg == g and hits[i]]
                if rows:
                    self._scatter(g, [chunk[i][2] for i in rows], stg[rows, : self._obj_bytes[g]])
            self._failed.update(bid for (_, _, bid), hit in zip(chunk, hits) if not hit)
        return True

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete inside start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # every layer of a block is saved together in wait_for_save

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        saves = getattr(self._get_connector_metadata(), "saves", None) or []
        if not saves or (self.use_mla and self.tp_rank != 0):
            return
        safe_call("vLLM save", None, self._save_units, self._units(saves))

    def _save_units(self, units: List[Tuple[bytes, int, int]]) -> None:
        c = self._client.get()
        if c is None:
            return
        for s in range(0, len(units), self.staging_blocks):
            chunk = units[s:s + self.staging_blocks]
            stg = self._staging_rows(len(chunk))
            for g in {g for _, g, _ in chunk}:
                rows = [i for i, (_, gg, _) in enumerate(chunk) if gg == g]
                tmp = torch.empty((len(rows), self._obj_bytes[g]), dtype=torch.uint8)
                self._gather(g, [chunk[i][2] for i in rows], tmp)
                stg[rows, : self._obj_bytes[g]] = tmp
            c.batch_put([k for k, _, _ in chunk], [stg[i, : self._obj_bytes[g]] for i, (_, g, _) in enumerate(chunk)])

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        failed, self._failed = self._failed, set()
        return failed

    def shutdown(self) -> None:
        self._client.close()
