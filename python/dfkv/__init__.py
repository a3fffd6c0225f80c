"""dfkv: Python binding and identity codec for the dfkv distributed KV cache.

Importing this package never loads ``libdfkv.so`` (see ``dfkv._lib``): the library is loaded
by the first ``Client(...)`` or ``version()`` call in the process that uses it, so engines may
import dfkv in a parent process and fork workers safely.

* ``Client`` / ``RawBuffer`` / ``version`` — the ctypes binding (``dfkv.client``)
* ``Error`` and its subclasses (``Unavailable``, ``Timeout``, ``Forbidden``, ``TooLarge``,
  ``DfkvError`` for misuse, ...) — what the raising calls raise (``dfkv.errors``)
* ``dfkv.identity`` — object ids, tenant hashes, structured namespace and object-key codec
* ``dfkv.ring`` — the weighted Ketama ring shared with the Go client
* ``dfkv.topology`` — the HLT1 topology from an MDS (import it explicitly; needs the
  ``flatbuffers`` runtime, the ``topology`` extra)
"""

from . import errors, identity, ring
from ._buffers import RawBuffer, nbytes_of
from ._version import __version__
from .client import MAX_VALUE_SIZE, Client, Tag, version
from .errors import (
    BufferTooSmall,
    Busy,
    CacheFull,
    DfkvError,
    DirectUnsupported,
    Error,
    Forbidden,
    InvalidRequest,
    ProtocolError,
    QuotaExceeded,
    ServerIOError,
    Timeout,
    TooLarge,
    Unavailable,
)

__all__ = [
    "BufferTooSmall",
    "Busy",
    "CacheFull",
    "Client",
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
    "MAX_VALUE_SIZE",
    "RawBuffer",
    "Tag",
    "identity",
    "nbytes_of",
    "ring",
    "version",
    "__version__",
    "errors",
]
