"""LMCache remote storage plugin over dfkv.

Load it as a remote storage plugin (LMCache config file or ``LMCACHE_*`` environment)::

    remote_storage_plugins: ["dfkv"]
    extra_config:
      remote_storage_plugin.dfkv.module_path: dfkv.connectors.lmcache_remote
      remote_storage_plugin.dfkv.class_name: DfkvConnectorAdapter
      remote_storage_plugin.dfkv.members: "n1=10.0.0.10:12000,n2=10.0.0.11:12000"

    # or the nodes as one URL, still through the plugin (one backend):
      remote_storage_plugin.dfkv.url: "dfkv://n1@10.0.0.10:12000,n2@10.0.0.11:12000"

Or, with the wheel installed (its ``dfkv-lmcache.pth`` lets LMCache's built-in adapter scan
find ``DfkvConnectorAdapter``; see ``_dfkv_lmcache_hook``), a URL alone and no plugin keys::

    remote_url: "dfkv://n1@10.0.0.10:12000,n2@10.0.0.11:12000"

Use one form or the other, not both: LMCache builds one RemoteBackend per plugin *and* one
for ``remote_url``, so the same chunks would be written twice.

LMCache's ``ConnectorManager`` imports the module named by
``remote_storage_plugin.<name>.module_path``, instantiates ``DfkvConnectorAdapter()`` and asks
it to ``create_connector`` for ``plugin://dfkv`` (or a ``dfkv://`` URL). The connector stores
each chunk as one raw dfkv object: the memory object's bytes, with no per-chunk metadata
(``save_chunk_meta`` is forced off), so a chunk is readable by any process with the same
namespace. Reads allocate from LMCache's local CPU backend and land directly in the memory
object's buffer; a partial chunk must be a whole number of tokens, anything else (short,
corrupt, oversized) is a miss.

Every blocking dfkv call runs on a small thread pool (``run_in_executor``), never on the event
loop; a dead node or any error is a miss / a failed put, never an exception into LMCache.

URL form: ``dfkv://[id@]host:port[,[id@]host:port...][?mds=h:p,..&group=g&tenant=t]``; a host
without ``id@`` gets the id ``host:port``. ``dfkv://`` alone or ``plugin://dfkv`` take the
nodes from the extra config (``members`` / ``mds_endpoints``) or ``DFKV_MEMBERS``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from .. import identity
from ._common import (
    ClientConfig,
    LazyClient,
    build_namespace,
    check_object_size,
    dtype_name,
    fingerprint,
    leading_hits,
    page_hash_bytes,
    safe_call,
)

__all__ = ["DfkvConnectorAdapter", "DfkvRemoteConnector", "LAYOUT_ID", "parse_dfkv_url"]

logger = logging.getLogger("dfkv.connectors.lmcache")

LAYOUT_ID = "lmcache/raw-v1"
PLUGIN = "dfkv"


def parse_dfkv_url(url: str) -> Dict[str, str]:
    """``dfkv://...`` -> config keys (members, mds_endpoints, mds_group, tenant)."""
    out: Dict[str, str] = {}
    if not url.startswith("dfkv://"):
        return out
    rest = url[len("dfkv://"):]
    hosts, _, query = rest.partition("?")
    hosts = hosts.rstrip("/")
    members = []
    for h in filter(None, (x.strip() for x in hosts.split(","))):
        node_id, at, addr = h.rpartition("@")
        if not at:
            node_id, addr = h, h
        members.append(f"{unquote(node_id)}={addr}")
    if members:
        out["members"] = ",".join(members)
    q = parse_qs(query)
    for src, dst in (("mds", "mds_endpoints"), ("group", "mds_group"), ("tenant", "tenant"),
                     ("members", "members")):
        if q.get(src):
            out[dst] = q[src][-1]
    return out


class DfkvConnectorAdapter(ConnectorAdapter):
    """Creates ``DfkvRemoteConnector`` for ``dfkv://`` and ``plugin://dfkv[.instance]``."""

    def __init__(self) -> None:
        super().__init__("dfkv://")

    def can_parse(self, url: str) -> bool:
        if url.startswith("dfkv://"):
            return True
        if url.startswith("plugin://"):
            return url[len("plugin://"):].split(".", 1)[0] == PLUGIN
        return False

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        plugin_name = getattr(context, "plugin_name", None)
        if plugin_name is None and context.url.startswith("plugin://"):
            plugin_name = context.url[len("plugin://"):]
        return DfkvRemoteConnector(loop=context.loop, local_cpu_backend=context.local_cpu_backend,
                                   config=context.config, url=context.url, plugin_name=plugin_name,
                                   metadata=getattr(context, "metadata", None))


class DfkvRemoteConnector(RemoteConnector):
    """LMCache ``RemoteConnector`` storing raw chunks in dfkv."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 url: Optional[str] = None, plugin_name: Optional[str] = None,
                 metadata: Any = None):
        config = config if config is not None else getattr(local_cpu_backend, "config", None)
        metadata = metadata if metadata is not None else getattr(local_cpu_backend, "metadata", None)
        super().__init__(config, metadata)
        self.save_chunk_meta = False  # raw values: no per-chunk header in dfkv objects
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name or PLUGIN

        extra = dict(getattr(config, "extra_config", None) or {})
        if not (url or "").startswith("dfkv://"):
            # The plugin route (one backend) takes the dfkv:// string from its own key.
            url = extra.get(f"remote_storage_plugin.{self.plugin_name}.url") or url
        for k, v in parse_dfkv_url(url or "").items():
            extra.setdefault(k, v)
        prefixes = (f"remote_storage_plugin.{self.plugin_name}.", f"remote_storage_plugin.{PLUGIN}.",
                    "dfkv.", "")
        self.cfg = ClientConfig.from_mapping(extra, prefixes=prefixes)
        self.cfg.require_endpoints("dfkv LMCache connector")
        threads = int(extra.get(f"remote_storage_plugin.{self.plugin_name}.threads",
                                extra.get("dfkv.threads", 4)))
        self._executor = ThreadPoolExecutor(max_workers=max(1, threads),
                                            thread_name_prefix="dfkv-lmcache")

        self.use_mla = bool(getattr(metadata, "use_mla", False))
        model = self.cfg.model or getattr(metadata, "model_name", None) or "unknown-model"
        self.world_size = int(getattr(metadata, "world_size", 1) or 1)
        chunk = int(getattr(metadata, "chunk_size", 0) or getattr(config, "chunk_size", 0) or 1)
        desc = {"shapes": [list(s) for s in self.meta_shapes],
                "dtypes": [dtype_name(d) for d in self.meta_dtypes],
                "fmt": str(self.meta_fmt), "mla": self.use_mla}
        ns = build_namespace(
            tenant=self.cfg.tenant, model=model, revision=self.cfg.revision, layout=LAYOUT_ID,
            dtype=dtype_name(getattr(metadata, "kv_dtype", None)), fingerprint=fingerprint(desc),
            page_tokens=max(1, chunk), page_bytes=int(self.full_chunk_size_bytes),
            tp=1 if self.use_mla else self.world_size)
        self._client = LazyClient(self.cfg, ns, name=f"lmcache[{self.plugin_name}]")
        self._builders: Dict[Tuple[int, int], Callable[[bytes], bytes]] = {}
        check_object_size(self._client, int(self.full_chunk_size_bytes),
                          "dfkv LMCache connector: one chunk object", "use a smaller chunk_size")
        logger.info("dfkv LMCache connector: model=%s world_size=%d chunk=%d bytes=%d mla=%s",
                    model, self.world_size, chunk, self.full_chunk_size_bytes, self.use_mla)

    # -- identity ---------------------------------------------------------------------------

    def object_key(self, key: Any) -> bytes:
        """dfkv key of an LMCache ``CacheEngineKey`` (chunk hash + identity not in the namespace)."""
        ws, wid = int(getattr(key, "world_size", 1) or 1), int(getattr(key, "worker_id", 0) or 0)
        if self.use_mla:
            ws, wid = 1, identity.REPLICATED
        b = self._builders.get((ws, wid))
        if b is None:
            b = identity.key_builder(pool="kv", component="latent" if self.use_mla else "kv",
                                     tp=(max(1, ws), min(wid, max(1, ws) - 1)))
            self._builders[(ws, wid)] = b
        ident = repr((getattr(key, "model_name", None), getattr(key, "_dtype_str", None) or
                      str(getattr(key, "dtype", "")), getattr(key, "tags", None),
                      getattr(key, "layer_id", None)))
        h = page_hash_bytes(getattr(key, "chunk_hash", key))
        return b(page_hash_bytes(h + b"|" + hashlib.sha256(ident.encode()).digest()[:8]))

    # -- blocking implementations (run on the executor) -------------------------------------

    def _client_or_none(self) -> Any:
        return self._client.get()

    def _exist_many(self, keys: List[Any]) -> List[bool]:
        c = self._client_or_none()
        if c is None or not keys:
            return [False] * len(keys)
        return c.batch_exist([self.object_key(k) for k in keys])

    def _finish_read(self, obj: Any, ok: bool, length: int) -> Any:
        if not ok or length <= 0:
            obj.ref_count_down()
            return None
        try:
            return self.reshape_partial_chunk(obj, length)
        except ValueError:  # not a whole number of tokens: short or corrupt
            logger.warning("dfkv LMCache: stored chunk of %d bytes is not a valid chunk; miss", length)
            obj.ref_count_down()
            return None

    def _get_many(self, keys: List[Any]) -> List[Any]:
        if not keys:
            return []
        c = self._client_or_none()
        if c is None:
            return [None] * len(keys)
        objs, bufs, idx = [], [], []
        for i in range(len(keys)):
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if obj is None:
                break  # no local memory: the rest are misses
            objs.append(obj)
            bufs.append(obj.byte_array)
            idx.append(i)
        out: List[Any] = [None] * len(keys)
        if not objs:
            return out
        try:
            res = c.batch_get_auto([self.object_key(keys[i]) for i in idx], bufs)
        except Exception:
            for o in objs:
                o.ref_count_down()
            raise
        for i, obj, (ok, length) in zip(idx, objs, res):
            out[i] = self._finish_read(obj, ok, length)
        return out

    def _put_many(self, keys: List[Any], objs: List[Any]) -> List[bool]:
        c = self._client_or_none()
        if c is None or not keys:
            return [False] * len(keys)
        dkeys = [self.object_key(k) for k in keys]
        oks = c.batch_put(dkeys, [o.byte_array for o in objs])
        safe_call("LMCache tag", None, self._tag_chunks, c, keys, dkeys, objs, oks)
        return oks

    def _tag_chunks(self, c: Any, keys: List[Any], dkeys: List[bytes], objs: List[Any], oks: List[bool]) -> None:
        """Attach LMCache's chunk hash to every stored chunk, as LMCache's own KV events
        (CacheStoreEvent) carry it: a node with --kv-events then publishes BlockStored /
        BlockRemoved under it (docs/EVENTS.md). The keys of one batch are consecutive chunks
        of a request, so chunk i's parent is chunk i-1. A layer-wise chunk is tagged once
        (its layer 0). Best effort, like every tag."""
        import dfkv

        def h(k: Any) -> Any:
            v = getattr(k, "chunk_hash", k)
            if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 64):
                return v
            return bytes(v) if isinstance(v, (bytes, bytearray)) else page_hash_bytes(v)

        tags = []
        for i, (k, dk, obj, ok) in enumerate(zip(keys, dkeys, objs, oks)):
            if not ok or getattr(k, "layer_id", None) not in (None, 0):
                continue
            hs = h(k)
            parent = h(keys[i - 1]) if i > 0 else None
            if parent is not None and isinstance(parent, int) != isinstance(hs, int):
                parent = None
            try:
                tokens = int(obj.get_num_tokens())
            except Exception:  # a memory object without token metadata: the chunk size
                tokens = int(getattr(self.metadata, "chunk_size", 0) or 0)
            tags.append(dfkv.Tag(key=dk, block_hashes=[hs], parent=parent, block_size=tokens,
                                 model=str(getattr(k, "model_name", None) or self.cfg.model or "")))
        if tags:
            c.tag(tags)

    async def _run(self, what: str, default: Any, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: safe_call(what, default, fn, *args))
        except RuntimeError as e:  # executor shut down (closing)
            logger.debug("dfkv LMCache %s after close: %s", what, e)
            return default

    # -- RemoteConnector ---------------------------------------------------------------------

    async def exists(self, key: Any) -> bool:
        res = await self._run("exists", [False], self._exist_many, [key])
        return bool(res and res[0])

    def exists_sync(self, key: Any) -> bool:
        res = safe_call("exists_sync", [False], self._exist_many, [key])
        return bool(res and res[0])

    async def get(self, key: Any) -> Any:
        res = await self._run("get", [None], self._get_many, [key])
        return res[0] if res else None

    async def put(self, key: Any, memory_obj: Any) -> None:
        res = await self._run("put", [False], self._put_many, [key], [memory_obj])
        if not (res and res[0]):
            logger.debug("dfkv LMCache: put failed (dropped; the chunk will be recomputed)")

    async def list(self) -> List[str]:
        # dfkv has no key enumeration (values are addressed by hashed ids only).
        return []

    async def close(self) -> None:
        # Waiting for in-flight dfkv calls (and closing the client) blocks: do it on a thread
        # so the event loop keeps serving LMCache's other tasks meanwhile.
        def shut() -> None:
            self._executor.shutdown(wait=True)
            self._client.close()

        await asyncio.get_running_loop().run_in_executor(None, shut)

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[Any]) -> List[Any]:
        keys = list(keys)
        return await self._run("batched_get", [None] * len(keys), self._get_many, keys)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[Any], memory_objs: List[Any]) -> None:
        await self._run("batched_put", [], self._put_many, list(keys), list(memory_objs))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[Any]) -> int:
        return leading_hits(safe_call("batched_contains", [], self._exist_many, list(keys)))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[Any], pin: bool = False) -> int:
        keys = list(keys)
        return leading_hits(await self._run("batched_async_contains", [], self._exist_many, keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[Any]) -> List[Any]:
        objs = await self.batched_get(list(keys))
        out = []
        for i, o in enumerate(objs):
            if o is None:
                for rest in objs[i + 1:]:
                    if rest is not None:
                        rest.ref_count_down()
                break
            out.append(o)
        return out

    def remove_sync(self, key: Any) -> bool:
        def rm() -> bool:
            c = self._client_or_none()
            return bool(c is not None and c.remove(self.object_key(key)))

        return safe_call("remove_sync", False, rm)

    def __repr__(self) -> str:
        return f"<DfkvRemoteConnector {self.plugin_name} pid={os.getpid()}>"
