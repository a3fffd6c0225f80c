"""The exceptions of the dfkv binding: one base class, ``dfkv.Error``, and a subclass per
outcome a caller branches on.

A cache miss is never an exception: ``Client.get(key)`` returns None. The raising forms
(``Client.get(key)`` without a size, ``Client.set``) turn the C ABI's ``dfkv_last_status``
code of a failed call into one of the classes below, with ``dfkv_last_error``'s reason as the
message::

    try:
        value = c.get(key)          # None on a miss
    except dfkv.Unavailable:        # node down or slow (Timeout is a subclass): recompute
        value = None
    except dfkv.Forbidden:          # the token does not grant reads on this tenant
        raise

``DfkvError`` (misuse: a closed client, bad arguments, a library that cannot be loaded) is a
subclass of ``Error`` too, so ``except dfkv.Error`` catches everything the binding raises.
The engine-style forms (``put``, ``get(key, size)``, ``get_into``, the batch calls) keep
their old contract: False / None on any failure, with the reason in ``Client.last_error()``.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

from . import _abi

__all__ = [
    "BufferTooSmall",
    "Busy",
    "CacheFull",
    "DfkvError",
    "DirectUnsupported",
    "Error",
    "Forbidden",
    "InvalidRequest",
    "ProtocolError",
    "QuotaExceeded",
    "ServerIOError",
    "Timeout",
    "TooLarge",
    "Unavailable",
    "error_for_status",
]


class Error(Exception):
    """Base class of every exception the dfkv binding raises.

    ``status`` is the C ABI's ``DFKV_STATUS_*`` code behind it (None for errors raised by the
    binding itself, such as misuse).
    """

    status: Optional[int] = None

    def __init__(self, message: str = "", status: Optional[int] = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class DfkvError(Error):
    """Misuse of the binding: closed client, bad arguments, open or load failure."""


class InvalidRequest(DfkvError):
    """The library or the node refused the request as invalid (e.g. a zero-length value)."""

    status = _abi.STATUS_INVALID


class Unavailable(Error):
    """The key's owner could not be reached (down, refused, no members): treat like a miss
    and recompute, or retry later."""

    status = _abi.STATUS_UNAVAILABLE


class Timeout(Unavailable):
    """The key's owner did not answer in time (an ``Unavailable``)."""

    status = _abi.STATUS_TIMEOUT


class Forbidden(Error):
    """The token (``DFKV_TOKEN``) is missing, unknown, revoked, or does not grant the op on
    the client's tenant."""

    status = _abi.STATUS_FORBIDDEN


class TooLarge(Error):
    """The value is larger than the max value size (``Client.max_value_size``), or, for
    ``get(key)``, larger than the ``MAX_VALUE_SIZE`` it reads at most (use
    ``get_auto(key, cap)`` with a larger cap)."""

    status = _abi.STATUS_TOO_LARGE


class BufferTooSmall(TooLarge):
    """The stored value is longer than the buffer it was to be read into (a ``TooLarge``)."""

    status = _abi.STATUS_BUFFER_TOO_SMALL


class CacheFull(Error):
    """The node has no room for the value and could not evict enough."""

    status = _abi.STATUS_CACHE_FULL


class QuotaExceeded(Error):
    """The tenant's quota on the node is spent."""

    status = _abi.STATUS_QUOTA_EXCEEDED


class Busy(Error):
    """The node could not take the write in time; nothing was stored. Retry later."""

    status = _abi.STATUS_BUSY


class ServerIOError(Error):
    """The node's disk failed the operation."""

    status = _abi.STATUS_IO_ERROR


class ProtocolError(Error):
    """An answer that breaks the wire protocol (a version mismatch or a bug)."""

    status = _abi.STATUS_PROTOCOL


class DirectUnsupported(Error):
    """A GET into registered device memory (``Client.register_dmabuf``) that cannot be served
    by RDMA straight into it: no RDMA to the key's owner, a server without the device-target
    capability, or a DMA-BUF registration the NIC refused. The library never falls back to
    TCP or a host staging copy for such a destination; the caller decides (e.g. recompute)."""

    status = _abi.STATUS_DIRECT_UNSUPPORTED


_BY_STATUS: Dict[int, Type[Error]] = {
    _abi.STATUS_UNAVAILABLE: Unavailable,
    _abi.STATUS_TIMEOUT: Timeout,
    _abi.STATUS_FORBIDDEN: Forbidden,
    _abi.STATUS_TOO_LARGE: TooLarge,
    _abi.STATUS_BUFFER_TOO_SMALL: BufferTooSmall,
    _abi.STATUS_CACHE_FULL: CacheFull,
    _abi.STATUS_QUOTA_EXCEEDED: QuotaExceeded,
    _abi.STATUS_BUSY: Busy,
    _abi.STATUS_IO_ERROR: ServerIOError,
    _abi.STATUS_INVALID: InvalidRequest,
    _abi.STATUS_PROTOCOL: ProtocolError,
    _abi.STATUS_CLOSED: DfkvError,
    _abi.STATUS_DIRECT_UNSUPPORTED: DirectUnsupported,
}


def error_for_status(status: int, message: str) -> Error:
    """The exception for a ``DFKV_STATUS_*`` code (``Error`` itself for an internal or
    unknown code, and for ``STATUS_OK``, which a failed call should never report)."""
    cls = _BY_STATUS.get(status, Error)
    return cls(message or f"dfkv: failed (status {status})", status=status)
