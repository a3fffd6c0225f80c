"""Pieces shared by the engine connectors: configuration, a lazily opened client, helpers.

Configuration keys (the same names in every engine's extra-config dict; LMCache also
accepts them under ``remote_storage_plugin.<plugin>.`` and ``dfkv.`` prefixes):

==================== ========================== ============================================
key                  environment fallback       meaning
==================== ========================== ============================================
members              DFKV_MEMBERS               static members "id=host:port[@w],..."
mds_endpoints        DFKV_MDS                   MDS replicas "host:port,..." (discovery)
mds_group            DFKV_MDS_GROUP             MDS group (default "default" in the library)
mds_poll_ms          -                          MDS poll interval (0 = library default)
register_with_mds    -                          register this consumer with the MDS (auto)
client_id            -                          id used for MDS registration
client_info          -                          "k=v,..." shown by ``dfkvctl clients``
batch_concurrency    -                          connections per node per batch (0 = default)
tenant               DFKV_TENANT                tenant in the namespace (quota tenant is the
                                                process's DFKV_TENANT, read by the library)
model                -                          model name (default: the engine's)
revision             DFKV_MODEL_REVISION        model revision / weights hash ("" = none)
reopen_interval_s    -                          seconds between attempts to open a client
                                                after a failed open (default 5)
rdma_depth           DFKV_RDMA_DEPTH            RDMA requests in flight per connection, and
                                                the SG lane's width per batch (0 = library
                                                default, 4)
==================== ========================== ============================================

``rdma_depth`` (and the SGLang connector's ``rail_affinity``) reach the library through its
``DFKV_RDMA_*`` environment, which libdfkv reads when a client opens (from the process's
live environment): the connector sets them in ``os.environ`` just before it opens its
client. They are process-wide: every client the process opens afterwards gets them too.

The client is opened on first use in the process that does the I/O (never at import or in
a parent that may fork). A process forked *after* its parent loaded libdfkv cannot use the
library at all (Go's runtime does not survive ``fork()``): the connector says so once, with
what to do, and stays a miss-only cache in that process, without retrying. Any other failure
to open a client is logged (then at most once a minute) and retried every
``reopen_interval_s``; until it opens every operation is a miss. Failed operations are logged
at most once per 30 s per kind. Connectors never raise into the engine's loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar

from .. import client as _client_mod
from .. import identity

__all__ = [
    "ClientConfig",
    "apply_library_env",
    "LazyClient",
    "dtype_name",
    "fingerprint",
    "leading_hits",
    "page_hash_bytes",
    "safe_call",
]

logger = logging.getLogger("dfkv.connectors")

T = TypeVar("T")

_KEYS = ("members", "mds_endpoints", "mds_group", "mds_poll_ms", "register_with_mds", "client_id",
         "client_info", "client_heartbeat_ms", "batch_concurrency", "tenant", "model", "revision",
         "reopen_interval_s", "rdma_depth")
_ENV = {"members": "DFKV_MEMBERS", "mds_endpoints": "DFKV_MDS", "mds_group": "DFKV_MDS_GROUP",
        "tenant": "DFKV_TENANT", "revision": "DFKV_MODEL_REVISION", "rdma_depth": "DFKV_RDMA_DEPTH"}


def _as_bool(v: Any) -> Optional[bool]:
    if v is None or isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


@dataclass
class ClientConfig:
    """Where the dfkv nodes are and how to open a client (see the module docstring)."""

    members: Optional[str] = None
    mds_endpoints: Optional[str] = None
    mds_group: Optional[str] = None
    mds_poll_ms: int = 0
    register_with_mds: Optional[bool] = None
    client_id: Optional[str] = None
    client_info: Optional[str] = None
    client_heartbeat_ms: int = 0
    batch_concurrency: int = 0
    tenant: str = ""
    model: Optional[str] = None
    revision: str = ""
    reopen_interval_s: float = 5.0
    rdma_depth: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)
    # DFKV_* settings the library must load with (the connector's rail affinity), applied
    # just before the client opens (apply_library_env).
    lib_env: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, cfg: Optional[Mapping[str, Any]], prefixes: Sequence[str] = ("",),
                     env: bool = True) -> "ClientConfig":
        """Read the keys from ``cfg`` (first matching prefix wins), then the environment."""
        cfg = dict(cfg or {})
        vals: Dict[str, Any] = {}
        for k in _KEYS:
            for p in prefixes:
                if p + k in cfg and cfg[p + k] is not None and cfg[p + k] != "":
                    vals[k] = cfg[p + k]
                    break
            if k not in vals and env and k in _ENV and os.environ.get(_ENV[k]):
                vals[k] = os.environ[_ENV[k]]
        out = cls(extra=cfg)
        for k, v in vals.items():
            if k in ("mds_poll_ms", "client_heartbeat_ms", "batch_concurrency"):
                v = int(v)
            elif k == "rdma_depth":
                v = int(v)
                if not 0 <= v <= 1024:
                    raise ValueError(f"rdma_depth {v}: want 0 (library default) .. 1024")
            elif k == "reopen_interval_s":
                v = float(v)
            elif k == "register_with_mds":
                v = _as_bool(v)
            elif k in ("members", "mds_endpoints") and not isinstance(v, str):
                v = ",".join(str(x) for x in v)
            elif k == "client_info" and isinstance(v, Mapping):
                v = ",".join(f"{a}={b}" for a, b in v.items())
            else:
                v = str(v)
            setattr(out, k, v)
        return out

    def require_endpoints(self, who: str) -> None:
        if not self.members and not self.mds_endpoints:
            raise ValueError(
                f"{who}: no dfkv nodes configured; set 'members' (\"id=host:port,...\") or "
                "'mds_endpoints' in the connector's extra config, or DFKV_MEMBERS / DFKV_MDS")

    def library_env(self) -> Dict[str, str]:
        """The DFKV_* environment the library must load with for this configuration."""
        env = dict(self.lib_env)
        if self.rdma_depth:
            env["DFKV_RDMA_DEPTH"] = str(self.rdma_depth)
        return env

    def client_kwargs(self) -> Dict[str, Any]:
        return dict(
            mds_endpoints=self.mds_endpoints or None, mds_group=self.mds_group or None,
            mds_poll_ms=self.mds_poll_ms, register_with_mds=self.register_with_mds,
            client_id=self.client_id, client_info=self.client_info,
            client_heartbeat_ms=self.client_heartbeat_ms, batch_concurrency=self.batch_concurrency)


class LazyClient:
    """A ``dfkv.Client`` opened on first use, in the process that uses it.

    ``get()`` returns the client, or None when it cannot be opened (logged; retried after
    ``reopen_interval_s``). The namespace may be replaced before or after opening
    (``set_namespace``); a changed namespace closes the current client.
    """

    def __init__(self, cfg: ClientConfig, namespace: bytes = b"", name: str = "dfkv"):
        self.cfg = cfg
        self.name = name
        self._ns = bytes(namespace)
        self._lock = threading.Lock()
        self._client: Any = None
        # The fork generation (dfkv.client) the client was opened under: checked on every
        # lookup instead of os.getpid(), a system call each time.
        self._gen: Optional[int] = None
        self._next_try = 0.0
        self._closed = False
        self._fatal: Optional[str] = None
        self._last_open_log = 0.0

    @property
    def namespace(self) -> bytes:
        return self._ns

    def set_namespace(self, namespace: bytes) -> None:
        namespace = bytes(namespace)
        with self._lock:
            if namespace == self._ns:
                return
            self._ns = namespace
            old, self._client = self._client, None
            self._next_try = 0.0
        if old is not None and self._gen == _client_mod._fork_generation:
            old.close()

    def peek(self) -> Any:
        """The open client, if any (no open attempt)."""
        return self._client if self._gen == _client_mod._fork_generation else None

    def get(self) -> Any:
        c = self._client
        gen = _client_mod._fork_generation
        if c is not None and self._gen == gen:
            return c
        with self._lock:
            if self._closed or self._fatal is not None:
                return None
            if self._client is not None and self._gen == gen:
                return self._client
            pid = os.getpid()
            from .. import _lib

            parent = _lib.forked_after_load()
            if parent is not None:
                self._fatal = (
                    f"{self.name}: this process ({pid}) was forked from process {parent} after "
                    "that process loaded libdfkv; a Go runtime does not survive fork(), so dfkv is "
                    "off in this process (every lookup is a miss). Start workers with the 'spawn' "
                    "multiprocessing method (vLLM: VLLM_WORKER_MULTIPROC_METHOD=spawn), or do not "
                    "use dfkv in the parent before it forks.")
                logger.error("%s", self._fatal)
                self._client = None
                return None
            if self._client is not None:  # inherited through fork(): drop, never touch
                self._client = None
                self._next_try = 0.0
            now = time.monotonic()
            if now < self._next_try:
                return None
            try:
                from ..client import Client

                apply_library_env(self.cfg.library_env(), self.name)
                self._client = Client(self.cfg.members or None, namespace=self._ns,
                                      **self.cfg.client_kwargs())
                self._gen = gen
                logger.info("%s: dfkv client open (%s, members=%s, mds=%s)", self.name,
                            self._client.transport_mode, self.cfg.members, self.cfg.mds_endpoints)
                return self._client
            except Exception as e:  # misconfiguration or no library: misses, logged
                self._next_try = now + max(0.0, self.cfg.reopen_interval_s)
                if now - self._last_open_log >= 60.0:
                    self._last_open_log = now
                    logger.error("%s: cannot open a dfkv client (every lookup is a miss until it "
                                 "opens; retried every %.0f s, logged once a minute): %s",
                                 self.name, self.cfg.reopen_interval_s, e)
                else:
                    logger.debug("%s: dfkv client still not open: %s", self.name, e)
                return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            c, self._client = self._client, None
        if c is not None and self._gen == _client_mod._fork_generation:
            try:
                c.close()
            except Exception:
                pass


def apply_library_env(env: Mapping[str, str], who: str) -> None:
    """Put ``env`` into this process's environment, where libdfkv reads its DFKV_* settings
    each time a client opens (the library syncs them from the live C environment)."""
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if changed:
        logger.debug("%s: library environment %s", who, changed)
    os.environ.update(env)


_LOG_EVERY_S = 30.0
_log_state: Dict[str, List[float]] = {}  # what -> [last logged (monotonic), suppressed count]
_log_mu = threading.Lock()


def log_limited(what: str, msg: str, *args: Any) -> bool:
    """Log a failure of kind ``what`` as a warning at most once per 30 s, with the number of
    failures suppressed since the last one; returns whether it logged."""
    now = time.monotonic()
    with _log_mu:
        st = _log_state.setdefault(what, [float("-inf"), 0.0])
        if now - st[0] < _LOG_EVERY_S:
            st[1] += 1
            return False
        suppressed, st[0], st[1] = int(st[1]), now, 0.0
    if suppressed:
        msg += " (%d more since the last report)"
        args = args + (suppressed,)
    logger.warning(msg, *args)
    return True


def check_object_size(lazy: "LazyClient", nbytes: int, what: str, hint: str) -> None:
    """Refuse to start (ValueError naming the flag to change) when one object of ``nbytes``
    exceeds the largest value every dfkv server accepts (advertised in HELLO): otherwise
    every PUT would fail, quietly, for the life of the engine. Unknown limits (no server
    reachable yet) pass; the PUTs then fail loudly enough on their own."""
    c = lazy.get()
    limit = c.max_value_size if c is not None else 0
    if nbytes and limit and nbytes > limit:
        raise ValueError(
            f"{what} is {nbytes} bytes but the dfkv servers accept at most {limit} bytes; start "
            f"dfkv_server with --max-msg {nbytes} or more, or {hint}")


def safe_call(what: str, default: T, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args)``; any exception is logged (rate-limited per ``what``) and turned into
    ``default`` (a miss)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        log_limited(what, "dfkv %s failed (treated as a miss): %s: %s", what, type(e).__name__, e)
        logger.debug("dfkv %s failure", what, exc_info=True)
        return default


def leading_hits(flags: Iterable[bool]) -> int:
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def page_hash_bytes(h: Any) -> bytes:
    """An engine's page/chunk hash as the key's page-hash blob (1..256 bytes)."""
    if isinstance(h, str):
        b = h.encode("utf-8")
    elif isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
    elif isinstance(h, int) and not isinstance(h, bool):
        b = h.to_bytes(max(1, (h.bit_length() + 8) // 8), "little", signed=True)
    else:
        b = repr(h).encode("utf-8")
    if not b:
        b = b"\x00"
    if len(b) > 256:
        b = b"sha256:" + hashlib.sha256(b).digest()
    return b


def fingerprint(desc: Mapping[str, Any]) -> bytes:
    """16-byte layout fingerprint of a JSON-able description (canonical key order)."""
    s = json.dumps(desc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(s.encode("utf-8")).digest()[:16]


def dtype_name(dtype: Any) -> str:
    """"bfloat16" for torch.bfloat16 / numpy dtypes / strings; "raw" when unknown."""
    if dtype is None:
        return "raw"
    s = str(dtype)
    for p in ("torch.", "numpy."):
        if s.startswith(p):
            s = s[len(p):]
    s = s.strip() or "raw"
    return s[:32]


def build_namespace(**fields: Any) -> bytes:
    """``identity.Namespace(**fields).encode()`` with over-long text fields trimmed."""
    if "model" in fields and len(str(fields["model"]).encode()) > 1024:
        fields["model"] = "sha256:" + hashlib.sha256(str(fields["model"]).encode()).hexdigest()
    return identity.Namespace(**fields).encode()


def addresses_segments(ptrs: Sequence[int], sizes: Sequence[int], n_items: int) -> List[List[Any]]:
    """Split flat per-item pointer/size lists (as engines report them) into per-item
    segment lists of ``RawBuffer`` (no copy: the buffers *are* the engine's memory)."""
    from .._buffers import RawBuffer

    if n_items <= 0:
        return []
    if len(ptrs) != len(sizes) or len(ptrs) % n_items:
        raise ValueError(f"{len(ptrs)} buffers / {len(sizes)} sizes do not split into {n_items} items")
    per = len(ptrs) // n_items
    return [[RawBuffer(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)]
            for i in range(n_items)]


def _seg_total(segs: Sequence[Any]) -> int:
    return sum(int(s.nbytes) for s in segs)


def put_segments(client: Any, keys: Sequence[bytes], seg_lists: Sequence[Sequence[Any]]) -> List[bool]:
    """Store item i as the concatenation of ``seg_lists[i]`` (RawBuffers).

    Items within the library's scatter-gather limit go zero-copy through
    ``dfkv_batch_put_sg``; an item with more segments is gathered into a bounce buffer first
    (a documented Python-level copy, only for layouts beyond the limit).
    """
    import ctypes

    n = len(keys)
    out = [False] * n
    limit = client.max_sg_segs
    direct = [i for i in range(n) if 0 < len(seg_lists[i]) <= limit]
    if direct:
        oks = client.batch_put_sg([keys[i] for i in direct], [seg_lists[i] for i in direct])
        for i, ok in zip(direct, oks):
            out[i] = ok
    for i in range(n):
        if len(seg_lists[i]) > limit:
            buf = bytearray(_seg_total(seg_lists[i]))
            base = (ctypes.c_char * len(buf)).from_buffer(buf)
            off = 0
            for s in seg_lists[i]:
                ctypes.memmove(ctypes.addressof(base) + off, s.addr, s.nbytes)
                off += s.nbytes
            del base
            out[i] = client.put(keys[i], buf)
    return out


def get_segments(client: Any, keys: Sequence[bytes], seg_lists: Sequence[Sequence[Any]]) -> List[bool]:
    """Read item i scattered across ``seg_lists[i]``; a hit only when the stored value is
    exactly the segments' total size (a short or long value is a miss)."""
    import ctypes

    n = len(keys)
    out = [False] * n
    limit = client.max_sg_segs
    direct = [i for i in range(n) if 0 < len(seg_lists[i]) <= limit]
    if direct:
        res = client.batch_get_auto_sg([keys[i] for i in direct], [seg_lists[i] for i in direct])
        for i, (ok, length) in zip(direct, res):
            out[i] = bool(ok) and length == _seg_total(seg_lists[i])
    for i in range(n):
        if len(seg_lists[i]) > limit:
            total = _seg_total(seg_lists[i])
            buf = bytearray(total)
            ok, length = client.get_auto(keys[i], buf)
            if ok and length == total:
                base = (ctypes.c_char * total).from_buffer(buf)
                off = 0
                for s in seg_lists[i]:
                    ctypes.memmove(s.addr, ctypes.addressof(base) + off, s.nbytes)
                    off += s.nbytes
                del base
                out[i] = True
    return out
