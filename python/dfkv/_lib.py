"""Locating and lazily loading ``libdfkv.so``, with ctypes prototypes for the whole C ABI v2.

Nothing here touches the shared library at import time. ``libdfkv.so`` embeds a Go runtime,
and a Go runtime does not survive ``fork()`` without ``exec``: inference engines import their
connectors in a parent that then forks workers, so the library must be loaded only in the
process that opens the first client (``load()``), and a process that inherited a loaded
library through ``fork()`` must not call into it (``load()`` refuses with ``DfkvError``).
Only one Go c-shared library can live in a process, so the library is loaded once.

Search order (first hit wins; the error lists everything tried):

1. ``$DFKV_LIB`` — an explicit path. When set it is the only candidate, so a typo fails
   loudly instead of silently loading another copy.
2. ``dfkv/lib/libdfkv.so`` inside the installed package (where a platform wheel puts it).
3. ``build/libdfkv.so`` in the source tree, found by walking up from the package directory.

The prototypes, the option struct and the constants come from ``_abi``, which
tools/gen_ctypes.py generates from ``go/cmd/libdfkv/dfkv.h`` (the contract); tools/test.sh
fails when it is stale.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import List, Optional

from . import _abi
from ._abi import ABI_VERSION, CLIENT_OPT_RDMA, CLIENT_OPT_REGISTER_WITH_MDS, ClientOptionsV2
from .errors import DfkvError  # defined with the other exceptions; re-exported here as before

__all__ = [
    "ABI_VERSION",
    "CLIENT_OPT_RDMA",
    "CLIENT_OPT_REGISTER_WITH_MDS",
    "ClientOptionsV2",
    "DfkvError",
    "LIB_NAME",
    "candidates",
    "is_loaded",
    "load",
    "loaded_path",
]

LIB_NAME = "libdfkv.so"


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lib_pid: Optional[int] = None


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def candidates() -> List[str]:
    """Paths ``load()`` would try, in order (explicit ``$DFKV_LIB`` stands alone)."""
    env = os.environ.get("DFKV_LIB")
    if env:
        return [env]
    pkg = _package_dir()
    out = [str(pkg / "lib" / LIB_NAME)]
    for parent in pkg.parents:
        out.append(str(parent / "build" / LIB_NAME))
    return out


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _abi.PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError names a symbol the library lacks
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """Load libdfkv.so once per process and return it with prototypes declared."""
    global _lib, _lib_path, _lib_pid
    pid = os.getpid()
    lib = _lib
    if lib is not None and _lib_pid == pid:
        return lib
    with _lock:
        if _lib is not None:
            if _lib_pid != pid:
                raise DfkvError(
                    f"{LIB_NAME} was loaded in process {_lib_pid} before this process ({pid}) was "
                    "forked from it; a Go runtime does not survive fork(). Import dfkv freely, but "
                    "open clients only after forking (or use the 'spawn' start method)."
                )
            return _lib
        tried = []
        for path in candidates():
            if not os.path.isfile(path):
                tried.append(f"{path}: not found")
                continue
            try:
                lib = ctypes.CDLL(path)
                _declare(lib)
            except (OSError, AttributeError) as e:
                tried.append(f"{path}: {e}")
                continue
            _lib, _lib_path, _lib_pid = lib, path, pid
            return lib
        raise DfkvError(
            f"cannot load {LIB_NAME}; set DFKV_LIB to its path, install a dfkv wheel that bundles "
            "it, or build it into <repo>/build. Tried:\n  " + "\n  ".join(tried)
        )


def forked_after_load() -> Optional[int]:
    """The pid that loaded the library when this process was forked from it afterwards (the
    library, with its Go runtime, cannot be used here), else None."""
    if _lib is not None and _lib_pid != os.getpid():
        return _lib_pid
    return None


def is_loaded() -> bool:
    """Whether this process (or a parent it was forked from) has loaded the library."""
    return _lib is not None


def loaded_path() -> Optional[str]:
    """The path the library was loaded from, None before the first ``load()``."""
    return _lib_path
