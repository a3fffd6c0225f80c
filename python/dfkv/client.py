"""``dfkv.Client``: the Python face of the C ABI v2 in ``libdfkv.so``.

One ``Client`` wraps one ``dfkv_client_t``. Every call passes the caller's memory straight to
the library (see ``_buffers``): values are never copied on the way in, and reads land directly
in caller buffers (``get_into``, ``get_auto(key, buf)``, the batch and scatter-gather forms).
The library releases the GIL during calls (ctypes does), so threads overlap their I/O.

Quick start::

    import dfkv

    with dfkv.Client("n1=127.0.0.1:12000", namespace=b"my-model") as c:
        c.set(b"k", b"value")          # raises dfkv.Error subclasses on failure
        c.get(b"k")                    # b"value"; None on a miss

Error model: a miss is never an exception (``None`` / ``False``). Two families of calls:

* the defaults — ``get(key)`` (no size) and ``set(key, value)`` — raise a ``dfkv.Error``
  subclass for every failure other than a miss (``Unavailable``, ``Timeout``, ``Forbidden``,
  ``TooLarge``, ...; see ``dfkv.errors``), mapped from the C ABI's ``dfkv_last_status``;
* the engine-style calls — ``put``, ``get(key, size)``, ``get_into``, ``get_auto``, ``exist``,
  ``remove`` and the batch and scatter-gather calls — return False / None on any failure, so
  a hot path never pays for an exception; ``last_error()`` says why.

``DfkvError`` (a ``dfkv.Error``) means misuse in both: a closed client, bad arguments, a
library that cannot be loaded or options it refuses.

Fork safety: the library is loaded when the first client opens, never at import. A client
(or a loaded library) inherited through ``fork()`` refuses to be used in the child; open a
new client there instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import numbers
import os
import sys
import threading
from collections.abc import Mapping
from ctypes import addressof, byref, c_int, c_ubyte, c_uint32, c_uint64, c_void_p
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _abi, _lib, identity
from ._buffers import Pins, RawBuffer, new_bytes
from ._lib import ABI_VERSION, CLIENT_OPT_REGISTER_WITH_MDS, ClientOptionsV2, DfkvError
from ._abi import STATUS_BUFFER_TOO_SMALL, STATUS_NOT_FOUND, STATUS_OK
from .errors import Error, error_for_status

__all__ = ["Client", "MAX_VALUE_SIZE", "Tag", "build_options", "version"]


@dataclasses.dataclass
class Tag:
    """The engine identity of one stored value, for KV events (``Client.tag``).

    ``block_hashes`` are the engine's block hashes (ints, or bytes of one length: vLLM's
    ExternalBlockHash is either, by version); ``parent`` the hash of the block before the
    first one (None for the first block of a sequence); ``model`` the label routers
    subscribe to; ``lora_id`` 0 for none."""

    key: bytes
    block_hashes: Sequence[Union[int, bytes]]
    model: str = ""
    parent: Optional[Union[int, bytes]] = None
    token_ids: Sequence[int] = ()
    block_size: int = 0
    lora_id: int = 0
    lora_name: str = ""


def _signed64(h: int) -> int:
    """The int64 bit pattern of a hash in int64 or uint64 range (uint64: DFKV_TAG_HASH_UINT64)."""
    h &= (1 << 64) - 1
    return h - (1 << 64) if h >= 1 << 63 else h

# Default server limit on one value: the longest value get(key) and get_auto(key) read.
MAX_VALUE_SIZE = 64 << 20

# get(key) and get_auto(key) read into a buffer of the client's, one per thread, grown on
# demand (a power of two from _GET_BUF_MIN up to _GET_BUF_KEEP), and copy the value out once.
# A fresh MAX_VALUE_SIZE reservation per call cost an mmap and munmap of 64 MiB and a page
# fault for every 4 KiB the value filled. A value longer than the buffer is refused by the
# node before any byte moves (the request carries the capacity), so the cost of a miss-sized
# guess is one small round trip; the call then reads with room for MAX_VALUE_SIZE. Values
# over _GET_BUF_KEEP read into a buffer of their own, so no thread holds more than 16 MiB.
_GET_BUF_MIN = 64 << 10
_GET_BUF_KEEP = 16 << 20

_I32_MAX = (1 << 31) - 1
_U64_MAX = (1 << 64) - 1
_VP = ctypes.POINTER(c_void_p)
_UBYTE = c_ubyte
_U64P = ctypes.POINTER(c_uint64)

# Bumped in a child after fork(). A client compares it with the value it was opened under
# on every call: cheaper than os.getpid(), which is a system call each time (glibc keeps no
# pid cache), and this check sits on every call's path.
_fork_generation = 0


class _LockedCounter:
    """itertools.count's next() where there is no GIL to make it atomic."""

    def __init__(self) -> None:
        self._n = 0
        self._l = threading.Lock()

    def __next__(self) -> int:
        with self._l:
            n = self._n
            self._n += 1
            return n


# The in-flight counters of Client (see Client.__init__): itertools.count under the GIL,
# a locked counter on a free-threaded interpreter.
_counter = itertools.count if getattr(sys, "_is_gil_enabled", lambda: True)() else _LockedCounter


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

Members = Union[str, Mapping, Iterable[Any], None]


def version() -> str:
    """Version string of the loaded libdfkv.so (loads the library in this process)."""
    return _lib.load().dfkv_version().decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------
# Options


def _cstr(name: str, s: Optional[str]) -> Optional[bytes]:
    if s is None:
        return None
    if not isinstance(s, str):
        raise DfkvError(f"{name} must be a str, not {type(s).__name__}")
    if "\0" in s:
        raise DfkvError(f"{name} must not contain NUL")
    return s.encode("utf-8")


def _int_opt(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise DfkvError(f"{name} must be an int in {lo}..{hi}, got {v!r}")
    return v


def _format_members(members: Members) -> Optional[str]:
    """Accepts "id=host:port[@w],...", {id: "host:port" | ("host:port", w)}, or an iterable
    of "id=host:port" strings / (id, "host:port"[, w]) tuples."""
    if members is None or isinstance(members, str):
        return members
    if isinstance(members, Mapping):
        items: Iterable[Any] = [(k,) + (tuple(v) if isinstance(v, (tuple, list)) else (v,))
                                for k, v in members.items()]
    else:
        items = members
    parts = []
    for m in items:
        if isinstance(m, str):
            parts.append(m)
        elif isinstance(m, (tuple, list)) and len(m) in (2, 3):
            s = f"{m[0]}={m[1]}"
            parts.append(s if len(m) == 2 else f"{s}@{int(m[2])}")
        else:
            raise DfkvError(f"bad member {m!r}; want 'id=host:port' or (id, 'host:port'[, weight])")
    return ",".join(parts)


def _format_info(info: Union[str, Mapping, None]) -> Optional[str]:
    if info is None or isinstance(info, str):
        return info
    if not isinstance(info, Mapping):
        raise DfkvError("client_info must be a str 'k=v,...' or a dict")
    parts = []
    for k, v in info.items():
        k, v = str(k), str(v)
        # The library splits on ',' then on the first '='; refuse what would not round-trip.
        if not k or "," in k or "=" in k or "," in v:
            raise DfkvError(f"client_info entry {k!r}={v!r}: keys need no ',' or '=', values no ','")
        parts.append(f"{k}={v}")
    return ",".join(parts)


def _namespace_bytes(namespace: Any) -> bytes:
    if hasattr(namespace, "encode") and not isinstance(namespace, str):
        namespace = namespace.encode()  # dfkv.identity.Namespace
    if isinstance(namespace, str):
        raise DfkvError("namespace is binary: pass bytes (or a dfkv.identity.Namespace), not str")
    try:
        return bytes(memoryview(namespace))
    except TypeError as e:
        raise DfkvError(f"namespace must be bytes-like, not {type(namespace).__name__}") from e


def build_options(
    members: Members = None,
    namespace: Any = b"",
    *,
    mds_endpoints: Union[str, Iterable[str], None] = None,
    mds_group: Optional[str] = None,
    mds_poll_ms: int = 0,
    register_with_mds: Optional[bool] = None,
    client_id: Optional[str] = None,
    client_info: Union[str, Mapping, None] = None,
    client_heartbeat_ms: int = 0,
    batch_concurrency: int = 0,
) -> Tuple[ClientOptionsV2, List[Any]]:
    """Fill a ``dfkv_client_options_v2``; returns it and the objects it points into.

    Only types and encodability are checked here; the library decides what is valid
    (e.g. neither members nor MDS endpoints makes ``dfkv_open_v2`` fail).
    """
    ns = _namespace_bytes(namespace)
    if mds_endpoints is not None and not isinstance(mds_endpoints, str):
        mds_endpoints = ",".join(mds_endpoints)
    if register_with_mds is None:
        # Auto: consumers register when they discover nodes through the MDS, unless the
        # operator opts out with DFKV_CLIENT_REGISTER=0 (as in the original system).
        register_with_mds = bool(mds_endpoints) and os.environ.get("DFKV_CLIENT_REGISTER", "1") != "0"
    o = ClientOptionsV2()
    o.struct_size = ctypes.sizeof(ClientOptionsV2)
    o.abi_version = ABI_VERSION
    o.members = _cstr("members", _format_members(members))
    ns_buf = ctypes.create_string_buffer(ns, len(ns)) if ns else None
    o.key_namespace = ctypes.addressof(ns_buf) if ns_buf is not None else None
    o.key_namespace_len = len(ns)
    o.batch_concurrency = _int_opt("batch_concurrency", batch_concurrency, 0, _U64_MAX)
    o.mds_endpoints = _cstr("mds_endpoints", mds_endpoints)
    o.mds_group = _cstr("mds_group", mds_group)
    o.mds_poll_ms = _int_opt("mds_poll_ms", mds_poll_ms, -_I32_MAX - 1, _I32_MAX)
    o.flags = CLIENT_OPT_REGISTER_WITH_MDS if register_with_mds else 0
    o.client_id = _cstr("client_id", client_id)
    o.client_info = _cstr("client_info", _format_info(client_info))
    o.client_heartbeat_ms = _int_opt("client_heartbeat_ms", client_heartbeat_ms, -_I32_MAX - 1, _I32_MAX)
    o.reserved0 = 0
    return o, [ns_buf]


# ---------------------------------------------------------------------------------------
# Client


def _is_int(v: Any) -> bool:
    # numbers.Integral admits numpy integers (sizes often come from array shapes), not bools.
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_len(name: str, n: Any) -> int:
    if not _is_int(n) or not 0 <= n <= _U64_MAX:
        raise DfkvError(f"{name} must be a non-negative int, got {n!r}")
    return int(n)


def _pair(keys: Sequence[Any], other: Sequence[Any], what: str) -> int:
    n = len(keys)
    if len(other) != n:
        raise DfkvError(f"{n} keys but {len(other)} {what}")
    if n > _I32_MAX:
        raise DfkvError("too many items for one batch")
    return n



def _memory_range(p: Pins, what: str, buf_or_ptr: Any, size: Optional[int]) -> "tuple[int, int]":
    """(address, length) of the range (un)register_memory names: a raw address with a
    size, or a buffer (read through ``p``) optionally cut to its first ``size`` bytes."""
    if _is_int(buf_or_ptr):
        if size is None:
            raise DfkvError(f"{what}(ptr, size): size is required with a raw address")
        return int(buf_or_ptr), _check_len("size", size)
    addr, n = p.read(buf_or_ptr, "memory")
    if size is not None:
        if _check_len("size", size) > n:
            raise DfkvError(f"size {size} exceeds the buffer's {n} bytes")
        n = size
    return addr, n

class Client:
    """A dfkv client. See the module docstring for the error model and fork rules.

    ``members``: static membership ("id=host:port[@weight],...", a dict or a list);
    ``namespace``: binary namespace (bytes, NUL allowed, or an ``identity.Namespace``);
    ``mds_endpoints``/``mds_group``/``mds_poll_ms``: MDS discovery;
    ``register_with_mds``: None = auto (with MDS endpoints, unless DFKV_CLIENT_REGISTER=0);
    ``client_id``/``client_info``/``client_heartbeat_ms``: registration details;
    ``batch_concurrency``: 0 = library default.

    TLS and tenant tokens pass through the environment, read by libdfkv: ``DFKV_TLS_CA``
    (verify nodes and the MDS; turns TLS on), ``DFKV_TLS_CERT``/``DFKV_TLS_KEY`` (client
    certificate for mTLS), ``DFKV_TOKEN`` and ``DFKV_TENANT`` (and every other ``DFKV_*`` setting). Each client
    open reads them from the process's environment as it is then (``os.environ`` included).
    A refused token makes operations fail like misses (False/None).
    """

    def __init__(
        self,
        members: Members = None,
        namespace: Any = b"",
        *,
        mds_endpoints: Union[str, Iterable[str], None] = None,
        mds_group: Optional[str] = None,
        mds_poll_ms: int = 0,
        register_with_mds: Optional[bool] = None,
        client_id: Optional[str] = None,
        client_info: Union[str, Mapping, None] = None,
        client_heartbeat_ms: int = 0,
        batch_concurrency: int = 0,
    ):
        self._h: Optional[int] = None  # set last, so __del__ of a half-built client is a no-op
        # The lock is off the per-call path: it guards close(), and the Condition over it
        # is for close() waiting on calls in flight (and _release's wake-up once closed).
        # Calls in flight are counted without a lock: two itertools.count objects, calls
        # started and calls ended, each advanced by one next() (a C call, atomic under the
        # GIL). That is ~0.5 us less per call than a Lock taken twice (docs/BENCHMARKS.md,
        # issue 17). close() reads both (advancing each by one, which cancels out) under the
        # Condition and waits until they agree.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._started = _counter()
        self._ended = _counter()
        self._registered: Dict[Tuple[int, int], List[Pins]] = {}  # (address, size) -> pins
        # (iova, size) registered with register_dmabuf: replaced, never mutated, so the per-call
        # path reads it without a lock
        self._dmabufs: Tuple[Tuple[int, int], ...] = ()
        self._getbuf = threading.local()  # get(key)'s read buffer per thread (_GET_BUF_MIN)
        self._namespace = _namespace_bytes(namespace)
        opts, keep = build_options(
            members, self._namespace, mds_endpoints=mds_endpoints, mds_group=mds_group,
            mds_poll_ms=mds_poll_ms, register_with_mds=register_with_mds, client_id=client_id,
            client_info=client_info, client_heartbeat_ms=client_heartbeat_ms,
            batch_concurrency=batch_concurrency)
        self._lib = _lib.load()
        h = self._lib.dfkv_open_v2(byref(opts))
        del keep  # the library copied everything it needs
        if not h:
            raise DfkvError(
                "dfkv_open_v2 refused the options (needs members or mds_endpoints; check their "
                f"syntax): members={opts.members!r} mds_endpoints={opts.mds_endpoints!r}; "
                "run with DFKV_LOG=1 for the library's reason"
            )
        self._pid = os.getpid()
        self._forks = _fork_generation
        mode = self._lib.dfkv_transport_mode(h)
        self._mode = mode.decode("ascii", "replace") if mode else "tcp"
        self._h = h

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> "Client":
        """``with dfkv.Client(...) as c:`` closes the client when the block ends."""
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be torn down
            pass

    def __repr__(self) -> str:
        state = "closed" if self._h is None else self._mode
        return f"<dfkv.Client {state}>"

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (or the client was inherited through ``fork()``)."""
        return self._h is None

    @property
    def namespace(self) -> bytes:
        """The binary namespace this client was opened with."""
        return self._namespace

    def object_id(self, key: Any) -> "identity.ObjectId":
        """The 128-bit object id the library computes for ``key`` in this namespace."""
        return identity.object_id(self._namespace, key)

    def close(self) -> None:
        """Close the client; idempotent. Waits for calls in flight on other threads."""
        if self._h is None:
            return
        if self._forks != _fork_generation:
            # Inherited through fork(): the parent's Go runtime is not here, and the lock may
            # have been copied while held by a parent thread. Drop the handle, touch nothing.
            self._h = None
            self._registered = {}
            return
        with self._cv:
            h, self._h = self._h, None
            if h is None:
                return
            # A call that read the handle counted itself started first (see _acquire), so
            # every call that can still reach the library is in the started count now. Ends
            # are read before starts: a call that slips in between can only make the two
            # differ (and its _release wakes us), never hide a call still in flight.
            while True:
                ended = next(self._ended)
                if next(self._started) == ended:
                    break
                self._cv.wait()
        self._lib.dfkv_close(h)
        for pins in self._registered.values():
            for p in pins:
                p.release()
        self._registered.clear()

    def _acquire(self) -> int:
        if self._forks != _fork_generation:  # checked before the lock: see close()
            raise DfkvError(
                f"this client was opened in process {self._pid}, before fork(); open a new "
                "client in the child"
            )
        next(self._started)  # before reading the handle: close() relies on the order
        h = self._h
        if h is None:
            self._release()
            raise DfkvError("client is closed")
        return h

    def _release(self) -> None:
        next(self._ended)
        if self._h is None:  # close() may be waiting for this call
            with self._cv:
                self._cv.notify_all()

    def _pins(self) -> Pins:
        # Device (GPU) memory reaches the library only as a GET destination inside a range
        # registered with register_dmabuf (written by RDMA alone); anything else on a device
        # is refused: the library's other paths read and write with the CPU.
        return Pins(False, self._dmabufs)

    # -- single-key operations ------------------------------------------------------------

    def put(self, key: Any, value: Any) -> bool:
        """Store ``value`` (any buffer) under ``key``: True, or False on any failure
        (zero-length values included; ``last_error()`` says why). ``set`` raises instead."""
        if type(key) is bytes and type(value) is bytes:
            # Fast path (the common engine call): ctypes passes a bytes object's own storage
            # for a void* argument, so no pinning calls are needed.
            h = self._acquire()
            try:
                return self._lib.dfkv_put(h, key, len(key), value, len(value)) == 0
            finally:
                self._release()
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                va, vn = p.read(value, "value")
                return self._lib.dfkv_put(h, ka, kn, va, vn) == 0
        finally:
            self._release()

    def set(self, key: Any, value: Any) -> None:
        """Store ``value`` (any non-empty buffer) under ``key``; raises on failure.

        The raising twin of ``put``: ``TooLarge`` (over ``max_value_size``), ``Forbidden``,
        ``Unavailable``/``Timeout``, ``CacheFull``, ``Busy``, ... (all ``dfkv.Error``);
        ``InvalidRequest`` for a zero-length value.
        """
        if not self.put(key, value):
            self._raise_failure("set")

    def get(self, key: Any, size: Optional[int] = None) -> Optional[bytes]:
        """The value stored under ``key`` as bytes, or None on a miss.

        ``get(key)``: any length up to ``MAX_VALUE_SIZE`` (64 MiB); failures other than a
        miss raise a ``dfkv.Error`` subclass (``Unavailable``, ``Timeout``, ``Forbidden``,
        ``TooLarge`` for a longer value, ...). It reads through a buffer the client keeps per
        thread (grown on demand, up to 16 MiB) and returns a copy of exactly the value, so a
        call allocates about the value's size.

        ``get(key, size)``: the engine-style exact-size read, unchanged: the value if it is
        stored with exactly ``size`` bytes, else None (a miss, a different length, or any
        failure; ``last_error()`` says which). Never raises but for misuse.
        """
        if size is None:
            return self._get_any(key)
        n = _check_len("size", size)
        out, addr = new_bytes(n)
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                return out if self._lib.dfkv_get(h, ka, kn, addr, n) == 1 else None
        finally:
            self._release()

    def get_into(self, key: Any, buf: Any) -> bool:
        """Read a value of exactly ``len(buf)`` bytes straight into ``buf``."""
        if type(key) is bytes and type(buf) is bytearray and buf:
            # Fast path: from_buffer exports the bytearray (it cannot be resized while `pin`
            # lives) in one C call; see docs/BENCHMARKS.md "C ABI" for what this saves.
            pin = _UBYTE.from_buffer(buf)
            h = self._acquire()
            try:
                return self._lib.dfkv_get(h, key, len(key), addressof(pin), len(buf)) == 1
            finally:
                self._release()
                del pin
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                ba, bn = p.write(buf)
                return self._lib.dfkv_get(h, ka, kn, ba, bn) == 1
        finally:
            self._release()

    def get_auto(self, key: Any, cap: Any = None) -> Any:
        """Read a value of unknown length.

        ``cap`` int (or None = MAX_VALUE_SIZE): returns the value as bytes, or None on a
        miss or when the stored value is longer than ``cap``.
        ``cap`` a writable buffer: reads into it and returns ``(hit, length)``.
        """
        if cap is None:
            return self._read_any(key)[0]
        if _is_int(cap):
            n = _check_len("cap", cap)
            out, addr = new_bytes(n)
            ok, length = self._get_auto(key, None, addr, n)
            if not ok:
                return None
            return out if length == n else out[:length]
        return self._get_auto(key, cap, 0, 0)

    def _get_any(self, key: Any) -> Optional[bytes]:
        value, status, msg = self._read_any(key)
        if value is None and status != STATUS_NOT_FOUND:
            raise error_for_status(status, f"get: {msg}" if msg else "get failed")
        return value

    def _read_any(self, key: Any) -> "tuple[Optional[bytes], int, str]":
        """(value, STATUS_OK, "") or (None, status, the library's message): a value of any
        length up to MAX_VALUE_SIZE, read through this thread's buffer (see _GET_BUF_MIN)."""
        tl = self._getbuf
        buf = getattr(tl, "buf", None)
        if buf is None:
            buf = tl.buf = (c_ubyte * _GET_BUF_MIN)()
        limit = MAX_VALUE_SIZE  # read per call: tests lower it
        if not getattr(tl, "big", False):
            n, status, msg = self._read_into(key, addressof(buf), min(len(buf), limit))
            if status == STATUS_OK:
                return ctypes.string_at(buf, n), status, msg
            if status != STATUS_BUFFER_TOO_SMALL or len(buf) >= limit:
                return None, status, msg
        # Longer than the buffer (or the last value was over _GET_BUF_KEEP): room for any.
        out, addr = new_bytes(limit)  # address space only until the library writes
        n, status, msg = self._read_into(key, addr, limit)
        if status != STATUS_OK:
            return None, status, msg
        tl.big = n > _GET_BUF_KEEP
        if not tl.big and n > len(buf):
            tl.buf = (c_ubyte * max(_GET_BUF_MIN, 1 << (n - 1).bit_length()))()
        return (out if n == limit else out[:n]), status, msg

    def _read_into(self, key: Any, addr: int, cap: int) -> "tuple[int, int, str]":
        """dfkv_get_auto into [addr, addr+cap): (length, STATUS_OK, "") or (0, status, message)."""
        out_len = c_uint64(0)
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                if self._lib.dfkv_get_auto(h, ka, kn, addr, cap, byref(out_len)) == 1:
                    return out_len.value, STATUS_OK, ""
                status = self._lib.dfkv_last_status(h)
                if status == STATUS_NOT_FOUND:
                    return 0, status, ""
                return 0, status, (self._lib.dfkv_last_error(h) or b"").decode("utf-8", "replace")
        finally:
            self._release()

    def _error(self, h: int, status: int, op: str) -> Error:
        msg = (self._lib.dfkv_last_error(h) or b"").decode("utf-8", "replace")
        return error_for_status(status, f"{op}: {msg}" if msg else f"{op} failed")

    def _raise_failure(self, op: str) -> None:
        """Raise the exception for this thread's last failed call on this client."""
        h = self._acquire()
        try:
            raise self._error(h, self._lib.dfkv_last_status(h), op)
        finally:
            self._release()

    def _get_auto(self, key: Any, buf: Any, addr: int, cap: int) -> Tuple[bool, int]:
        out_len = c_uint64(0)
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                if buf is not None:
                    addr, cap = p.write(buf)
                ok = self._lib.dfkv_get_auto(h, ka, kn, addr, cap, byref(out_len)) == 1
                return (True, out_len.value) if ok else (False, 0)
        finally:
            self._release()

    def exist(self, key: Any) -> bool:
        """True when ``key`` is stored (False on a miss or any failure)."""
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                return self._lib.dfkv_exist(h, ka, kn) == 1
        finally:
            self._release()

    def remove(self, key: Any) -> bool:
        """True when the owner confirmed the key is gone (removed now or already absent)."""
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kn = p.read(key, "key")
                return self._lib.dfkv_remove(h, ka, kn) == 1
        finally:
            self._release()

    # -- KV events ---------------------------------------------------------------------------

    def tag(self, tags: Sequence["Tag"]) -> int:
        """Attach engine identities to stored values (send after their puts returned): a
        node with ``--kv-events`` publishes BlockStored for each, and BlockRemoved when the
        value is evicted, removed or overwritten (docs/EVENTS.md). Returns how many were
        attached (values not stored are skipped; nodes without events attach none), or -1
        when a node failed or is older than tags (``last_error`` says why)."""
        n = len(tags)
        if not n:
            return 0
        arr = (_abi.BlockTag * n)()
        keep: List[Any] = [arr]
        for i, t in enumerate(tags):
            if not isinstance(t, Tag):
                raise DfkvError(f"tags[{i}] must be a dfkv.Tag, not {type(t).__name__}")
            hashes = list(t.block_hashes)
            if not hashes:
                raise DfkvError(f"tags[{i}]: no block hash")
            is_bytes = isinstance(hashes[0], (bytes, bytearray))
            if any(isinstance(h, (bytes, bytearray)) != is_bytes for h in hashes) or (
                t.parent is not None and isinstance(t.parent, (bytes, bytearray)) != is_bytes
            ):
                raise DfkvError(f"tags[{i}]: block hashes mix bytes and ints")
            e = arr[i]
            e.struct_size = ctypes.sizeof(_abi.BlockTag)
            key = bytes(t.key)
            keep.append(key)
            e.key, e.key_len = ctypes.cast(ctypes.c_char_p(key), c_void_p), len(key)
            if is_bytes:
                hl = len(hashes[0])
                if any(len(h) != hl for h in hashes) or (t.parent is not None and len(t.parent) != hl):
                    raise DfkvError(f"tags[{i}]: bytes block hashes must have one length")
                buf = ctypes.create_string_buffer(b"".join(bytes(h) for h in hashes), hl * len(hashes))
                e.flags, e.hash_len = _abi.TAG_HASH_BYTES, hl
                if t.parent is not None:
                    pb = ctypes.create_string_buffer(bytes(t.parent), hl)
                    keep.append(pb)
                    e.parent_hash = ctypes.cast(pb, c_void_p)
            else:
                ints = [int(h) for h in hashes] + ([int(t.parent)] if t.parent is not None else [])
                if any(not -(1 << 63) <= h < (1 << 64) for h in ints) or (min(ints) < 0 and max(ints) >= 1 << 63):
                    raise DfkvError(f"tags[{i}]: int block hashes must all fit int64 or all uint64")
                if max(ints) >= 1 << 63:
                    e.flags = _abi.TAG_HASH_UINT64  # vLLM's int hashes are unsigned 64-bit
                buf = (ctypes.c_int64 * len(hashes))(*[_signed64(h) for h in hashes])
                if t.parent is not None:
                    pb = ctypes.c_int64(_signed64(t.parent))
                    keep.append(pb)
                    e.parent_hash = ctypes.cast(ctypes.pointer(pb), c_void_p)
            keep.append(buf)
            e.hashes, e.n_hashes = ctypes.cast(buf, c_void_p), len(hashes)
            if t.token_ids:
                toks = (ctypes.c_int32 * len(t.token_ids))(*t.token_ids)
                keep.append(toks)
                e.token_ids, e.n_tokens = ctypes.cast(toks, ctypes.POINTER(ctypes.c_int32)), len(t.token_ids)
            e.block_size = _int_opt("block_size", t.block_size, 0, 0xFFFFFFFF)
            e.lora_id = _int_opt("lora_id", t.lora_id or 0, 0, (1 << 63) - 1)
            if t.model:
                e.model = _cstr("model", t.model)
            if t.lora_name:
                e.lora_name = _cstr("lora_name", t.lora_name)
        h = self._acquire()
        try:
            return int(self._lib.dfkv_tag(h, arr, n))
        finally:
            self._release()
            del keep

    # -- batch operations -------------------------------------------------------------------
    #
    # Every batch call has the shape fn(h, keys, key_lens, <arrays...>, n, <scalars...>,
    # out_ok[, out_lens]); _batch runs it (pinning, the in-flight count, the return code) and
    # each method says only how its arrays are filled and how its outputs read.

    @staticmethod
    def _key_arrays(p: Pins, keys: Sequence[Any]) -> Tuple[Any, Any]:
        n = len(keys)
        ka = p.keep((c_void_p * n)())
        kl = p.keep((c_uint64 * n)())
        for i, k in enumerate(keys):
            ka[i], kl[i] = p.read(k, f"keys[{i}]")
        return ka, kl

    @staticmethod
    def _buf_arrays(p: Pins, bufs: Sequence[Any], write: bool, what: str) -> Tuple[Any, Any]:
        n = len(bufs)
        ba = p.keep((c_void_p * n)())
        bl = p.keep((c_uint64 * n)())
        get = p.write if write else p.read
        for i, b in enumerate(bufs):
            ba[i], bl[i] = get(b, f"{what}[{i}]")
        return ba, bl

    def _batch(self, name: str, keys: Sequence[Any], n: int,
               arrays: Optional[Callable[[Pins], Tuple[Any, ...]]] = None,
               scalars: Tuple[Any, ...] = (), lens: bool = False) -> Tuple[Any, Any]:
        """Runs dfkv_<name> over n items; returns its out_ok array (and out_lens when
        ``lens``). ``arrays(p)`` pins and builds the per-item arrays after the keys."""
        out = (c_int * n)()
        tail: Tuple[Any, ...] = (out, (c_uint64 * n)()) if lens else (out,)
        h = self._acquire()
        try:
            with self._pins() as p:
                ka, kl = self._key_arrays(p, keys)
                mid = arrays(p) if arrays is not None else ()
                rc = getattr(self._lib, name)(h, ka, kl, *mid, n, *scalars, *tail)
        finally:
            self._release()
        if rc != 0:
            raise DfkvError(f"{name} rejected the batch (bad arguments or too many items)")
        return out, tail[-1]

    def batch_put(self, keys: Sequence[Any], values: Sequence[Any]) -> List[bool]:
        """Store each value under its key; per-item success."""
        n = _pair(keys, values, "values")
        if not n:
            return []
        out, _ = self._batch("dfkv_batch_put", keys, n, lambda p: self._buf_arrays(p, values, False, "values"))
        return [v == 1 for v in out]

    def batch_get_into(self, keys: Sequence[Any], bufs: Sequence[Any]) -> List[bool]:
        """Exact-size reads into caller buffers; per-item hit."""
        n = _pair(keys, bufs, "buffers")
        if not n:
            return []
        out, _ = self._batch("dfkv_batch_get", keys, n, lambda p: self._buf_arrays(p, bufs, True, "bufs"))
        return [v == 1 for v in out]

    def batch_get(self, keys: Sequence[Any], sizes: Union[int, Sequence[int]]) -> List[Optional[bytes]]:
        """Exact-size reads returning bytes (None per miss); ``sizes`` int or per key."""
        if _is_int(sizes):
            sizes = [sizes] * len(keys)
        n = _pair(keys, sizes, "sizes")
        sizes = [_check_len("size", s) for s in sizes]
        if not n:
            return []
        outs = [new_bytes(s) for s in sizes]
        hits = self.batch_get_into(keys, [RawBuffer(a, s) for (_, a), s in zip(outs, sizes)])
        return [b if ok else None for (b, _), ok in zip(outs, hits)]

    def batch_get_auto(self, keys: Sequence[Any], caps: Any) -> List[Any]:
        """Reads of unknown length. Per item, like ``get_auto``: an int cap gives bytes|None,
        a writable buffer gives ``(hit, length)``. ``caps`` may be one int for every key."""
        if _is_int(caps):
            caps = [caps] * len(keys)
        n = _pair(keys, caps, "caps/buffers")
        if not n:
            return []
        owned: List[Optional[bytes]] = [None] * n

        def arrays(p: Pins) -> Tuple[Any, Any]:
            ba = p.keep((c_void_p * n)())
            bl = p.keep((c_uint64 * n)())
            for i, c in enumerate(caps):
                if _is_int(c):
                    owned[i], ba[i] = new_bytes(_check_len(f"caps[{i}]", c))
                    bl[i] = int(c)
                else:
                    ba[i], bl[i] = p.write(c, f"bufs[{i}]")
            return ba, bl

        out, out_lens = self._batch("dfkv_batch_get_auto", keys, n, arrays, lens=True)
        res: List[Any] = []
        for i in range(n):
            ok, length = out[i] == 1, out_lens[i] if out[i] == 1 else 0
            b = owned[i]
            if b is None:
                res.append((ok, length))
            else:
                res.append(None if not ok else (b if length == len(b) else b[:length]))
        return res

    def batch_exist(self, keys: Sequence[Any]) -> List[bool]:
        """Per key: True when it is stored."""
        return self._keys_only("dfkv_batch_exist", keys)

    def batch_exist_lease(self, keys: Sequence[Any], lease_ms: int = 0) -> List[int]:
        """Look keys up and lease the hits on their servers: per key 1 = hit and leased (safe
        from eviction until it is read or ``lease_ms`` passes; 0 = the server's default,
        10 s), 2 = hit without a lease (the server's lease budget is spent), 0 = miss."""
        lease_ms = _int_opt("lease_ms", lease_ms, 0, 0xFFFFFFFF)
        n = _pair(keys, keys, "keys")
        if not n:
            return []
        out, _ = self._batch("dfkv_batch_exist_lease", keys, n, scalars=(lease_ms,))
        return [int(v) for v in out]

    def batch_remove(self, keys: Sequence[Any]) -> List[bool]:
        """Per key: True when the owner confirmed it is gone (see ``remove``)."""
        return self._keys_only("dfkv_batch_remove", keys)

    def _keys_only(self, name: str, keys: Sequence[Any]) -> List[bool]:
        n = _pair(keys, keys, "keys")
        return [v == 1 for v in self._batch(name, keys, n)[0]] if n else []

    # -- scatter-gather ---------------------------------------------------------------------

    @staticmethod
    def _sg_arrays(p: Pins, seg_lists: Sequence[Sequence[Any]], write: bool) -> Tuple[Any, Any, Any]:
        n = len(seg_lists)
        ptrs = p.keep((_VP * n)())
        lens = p.keep((_U64P * n)())
        counts = p.keep((c_uint32 * n)())
        get = p.write if write else p.read
        for i, segs in enumerate(seg_lists):
            m = len(segs)
            counts[i] = min(m, 0xFFFFFFFF)
            if not m:
                continue  # NULL arrays with count 0: the library fails this item
            pa = p.keep((c_void_p * m)())
            la = p.keep((c_uint64 * m)())
            for j, s in enumerate(segs):
                pa[j], la[j] = get(s, f"segments[{i}][{j}]")
            ptrs[i] = ctypes.cast(pa, _VP)
            lens[i] = ctypes.cast(la, _U64P)
        return ptrs, lens, counts

    def batch_put_sg(self, keys: Sequence[Any], segments: Sequence[Sequence[Any]]) -> List[bool]:
        """Item i stores the concatenation of ``segments[i]`` (1..max_sg_segs buffers)."""
        n = _pair(keys, segments, "segment lists")
        if not n:
            return []
        out, _ = self._batch("dfkv_batch_put_sg", keys, n, lambda p: self._sg_arrays(p, segments, False))
        return [v == 1 for v in out]

    def batch_get_auto_sg(self, keys: Sequence[Any], segments: Sequence[Sequence[Any]]) -> List[Tuple[bool, int]]:
        """Item i scatters its value (at most the segments' total size) across
        ``segments[i]`` in order; per item ``(hit, length)``."""
        n = _pair(keys, segments, "segment lists")
        if not n:
            return []
        out, out_lens = self._batch("dfkv_batch_get_auto_sg", keys, n,
                                    lambda p: self._sg_arrays(p, segments, True), lens=True)
        return [(True, out_lens[i]) if out[i] == 1 else (False, 0) for i in range(n)]

    @property
    def max_sg_segs(self) -> int:
        """Most segments one scatter-gather item may have."""
        h = self._acquire()
        try:
            return int(self._lib.dfkv_max_sg_segs(h))
        finally:
            self._release()

    @property
    def max_value_size(self) -> int:
        """Largest value every current member accepts (the servers advertise theirs in HELLO);
        0 when no member answers."""
        h = self._acquire()
        try:
            return int(self._lib.dfkv_max_value_size(h))
        finally:
            self._release()

    # -- transport, memory, introspection -----------------------------------------------------

    def register_memory(self, buf_or_ptr: Any, size: Optional[int] = None) -> bool:
        """Register memory for RDMA, once per device for all of the client's connections
        (on TCP it only records the range).

        A buffer object is pinned (kept alive, not resizable) until ``unregister_memory`` of
        the same range or close; a raw int address needs ``size`` and must stay valid until
        then.
        """
        p = Pins(device_ok=True)
        try:
            addr, n = _memory_range(p, "register_memory", buf_or_ptr, size)
            if not _is_int(buf_or_ptr):
                p.keep(buf_or_ptr)
            h = self._acquire()
            try:
                ok = self._lib.dfkv_register_memory(h, addr, n) == 0
            finally:
                self._release()
        except BaseException:
            p.release()
            raise
        if ok:
            self._registered.setdefault((addr, n), []).append(p)
        else:
            p.release()
        return ok

    def unregister_memory(self, buf_or_ptr: Any, size: Optional[int] = None) -> bool:
        """Undo ``register_memory`` for exactly the range it registered (same buffer or
        address, same size): waits for calls in flight that use it, deregisters it, and
        unpins the buffer. False (``last_error`` says why) for a range that is not registered,
        a second unregister included. After True the memory may be freed or reused."""
        p = Pins(device_ok=True)
        try:
            addr, n = _memory_range(p, "unregister_memory", buf_or_ptr, size)
            h = self._acquire()
            try:
                ok = self._lib.dfkv_unregister_memory(h, addr, n) == 0
            finally:
                self._release()
        finally:
            p.release()
        if ok:
            for q in self._registered.pop((addr, n), []):
                q.release()
        return ok

    def register_dmabuf(self, fd: int, offset: int, size: int, iova: int) -> None:
        """Register bytes ``[offset, offset+size)`` of the DMA-BUF ``fd`` as device memory on
        every RDMA device the client uses. ``iova`` is the address that memory is named by in
        GET calls (for CUDA: the device pointer of its first byte).

        Afterwards GET destinations inside ``[iova, iova+size)`` (a CUDA tensor, a
        ``RawBuffer(ptr, n, device=True)`` or a ``(ptr, n)`` pair, through ``get_into``,
        ``get_auto`` with a buffer, ``batch_get_into``, ``batch_get_auto`` and
        ``batch_get_auto_sg``) are served only by RDMA WRITEs straight into the device memory:
        never over TCP, never through a host staging copy. A GET that cannot be served so
        fails (``last_error()``; ``DirectUnsupported`` for the raising forms).

        The fd may be closed after the call. The memory must stay allocated until
        ``unregister_dmabuf`` or ``close``. Raises ``InvalidRequest`` (bad fd, size 0, iova 0,
        overflow), ``DirectUnsupported`` (no RDMA, or the NIC refused the DMA-BUF), or another
        ``dfkv.Error``.
        """
        if not _is_int(fd) or not -(1 << 31) <= fd < (1 << 31):
            raise DfkvError(f"register_dmabuf: fd must be an int (a file descriptor), got {fd!r}")
        offset, size, iova = (_check_len(n, v) for n, v in (("offset", offset), ("size", size), ("iova", iova)))
        h = self._acquire()
        try:
            if self._lib.dfkv_register_dmabuf(h, int(fd), offset, size, iova) != 0:
                raise self._error(h, self._lib.dfkv_last_status(h), "register_dmabuf")
            with self._lock:
                if (iova, size) not in self._dmabufs:
                    self._dmabufs = self._dmabufs + ((iova, size),)
        finally:
            self._release()

    def unregister_dmabuf(self, iova: int, size: int) -> None:
        """Undo ``register_dmabuf`` for exactly ``[iova, iova+size)``: GETs into it are
        refused at once, those in flight are waited for (at most twice the I/O timeout, else
        ``Busy`` and it stays registered), then it is deregistered on every device; afterwards
        no remote write can reach the memory and it may be freed. ``InvalidRequest`` for a
        range that is not registered (a second unregister included)."""
        iova, size = _check_len("iova", iova), _check_len("size", size)
        h = self._acquire()
        try:
            with self._lock:  # refuse new GETs into it here first, as the library does
                before = self._dmabufs
                self._dmabufs = tuple(r for r in before if r != (iova, size))
            if self._lib.dfkv_unregister_dmabuf(h, iova, size) != 0:
                status = self._lib.dfkv_last_status(h)
                if status == _abi.STATUS_BUSY and (iova, size) in before:
                    with self._lock:  # still registered in the library
                        if (iova, size) not in self._dmabufs:
                            self._dmabufs = self._dmabufs + ((iova, size),)
                raise self._error(h, status, "unregister_dmabuf")
        finally:
            self._release()

    def last_error(self) -> str:
        """Why this thread's most recent failed call on this client failed (a miss included),
        "" if none or once closed (``dfkv_last_error``)."""
        h = self._h
        if h is None:
            return ""
        return (self._lib.dfkv_last_error(h) or b"").decode("utf-8", "replace")

    def last_status(self) -> int:
        """The ``DFKV_STATUS_*`` code of the failure ``last_error()`` describes (this thread's
        most recent failed call on this client; ``STATUS_OK`` if none or once closed): what the
        engine-style calls (False / None on failure) are branched on, e.g.
        ``STATUS_DIRECT_UNSUPPORTED`` for a GET into device memory that RDMA cannot serve."""
        h = self._h
        if h is None:
            return STATUS_OK
        return int(self._lib.dfkv_last_status(h))

    def last_exception(self) -> Optional[Error]:
        """The ``dfkv.Error`` (subclass by status: ``DirectUnsupported``, ``Unavailable``,
        ...) for this thread's most recent failed call on this client, None if none."""
        status = self.last_status()
        if status == STATUS_OK:
            return None
        return error_for_status(status, self.last_error())

    @property
    def transport_mode(self) -> str:
        """"tcp" (RDMA off), "rdma" (in use), or "tcp(<reason>)" when RDMA was asked for
        (DFKV_RDMA=1) but is not in use; "closed" once closed."""
        try:
            h = self._acquire()
        except DfkvError:
            if self._h is None:
                return "closed"
            raise
        try:
            mode = self._lib.dfkv_transport_mode(h)
        finally:
            self._release()
        return mode.decode("ascii", "replace") if mode else "tcp"


    def stats_snapshot(self) -> str:
        """The client's metrics in Prometheus text format."""
        h = self._acquire()
        try:
            n = int(self._lib.dfkv_stats_snapshot(h, None, 0))
            for _ in range(8):  # metrics may grow between the sizing call and the copy
                buf = ctypes.create_string_buffer(n + 1024)
                full = int(self._lib.dfkv_stats_snapshot(h, buf, len(buf)))
                if full <= len(buf):
                    return buf.raw[:full].decode("utf-8", "replace")
                n = full
            return buf.raw.decode("utf-8", "replace")
        finally:
            self._release()

    @staticmethod
    def version() -> str:
        """Version string of the loaded libdfkv.so (``dfkv.version()``)."""
        return version()
