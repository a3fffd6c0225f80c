"""Zero-copy access to caller memory for the ctypes binding.

The C ABI reads and writes caller memory only during a call, so the binding needs, per call,
the address and length of every key and value buffer and a guarantee that the memory stays
put until the call returns. ``Pins`` collects those guarantees and releases them afterwards.

Accepted objects:

* ``bytes`` — read-only fast path: the address of the object's own storage (no copy).
* any other buffer-protocol object (bytearray, memoryview, array.array, mmap, numpy arrays,
  read-only ones included for reads) — exported with ``PyObject_GetBuffer`` asking for a
  C-contiguous buffer (writable when the library writes into it). Holding the export keeps
  the memory alive and blocks resizing (a bytearray cannot reallocate under the call).
* objects with ``data_ptr()`` (torch tensors, ``RawBuffer``) — size from ``nbytes`` or
  ``numel() * element_size()``; must be contiguous, and on the CPU unless the transport can
  reach device memory (RDMA with registered memory).
* GET destinations only: device memory inside a range registered with
  ``Client.register_dmabuf`` — a CUDA tensor, ``RawBuffer(ptr, n, device=True)`` or a raw
  ``(ptr, nbytes)`` pair of ints (a device pointer). The library writes such a destination
  only by RDMA into the device memory, never with the CPU; device memory outside every
  registered range, and device memory as a PUT source, are refused.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_ssize_t, c_void_p, py_object
from typing import Any, List, Tuple

from ._lib import DfkvError

__all__ = ["Pins", "RawBuffer", "new_bytes", "nbytes_of"]


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (layout stable since 3.0; part of the limited API since 3.11)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", c_void_p),
        ("strides", c_void_p),
        ("suboffsets", c_void_p),
        ("internal", c_void_p),
    ]


_PyBUF_WRITABLE = 0x0001
_PyBUF_C_CONTIGUOUS = 0x0038  # C_CONTIGUOUS | STRIDES | ND

_api = ctypes.pythonapi
_get_buffer = _api.PyObject_GetBuffer
_get_buffer.argtypes = [py_object, ctypes.POINTER(_PyBuffer), c_int]
_get_buffer.restype = c_int
_release_buffer = _api.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_bytes_new = _api.PyBytes_FromStringAndSize
_bytes_new.argtypes = [c_void_p, c_ssize_t]
_bytes_new.restype = py_object
_bytes_addr = _api.PyBytes_AsString
_bytes_addr.argtypes = [py_object]
_bytes_addr.restype = c_void_p


class RawBuffer:
    """A raw (address, size) region, e.g. from an engine's page-buffer metadata.

    The caller guarantees the memory is valid for the duration of each call using it.
    """

    __slots__ = ("addr", "nbytes", "device")

    def __init__(self, addr: int, nbytes: int, device: bool = False):
        if not isinstance(addr, int) or addr <= 0:
            raise DfkvError("RawBuffer address must be a positive int")
        if not isinstance(nbytes, int) or nbytes < 0:
            raise DfkvError("RawBuffer size must be a non-negative int")
        self.addr = addr
        self.nbytes = nbytes
        self.device = device

    def data_ptr(self) -> int:
        """The address (torch-style ``data_ptr()``, so RawBuffer passes where a tensor would)."""
        return self.addr

    def __repr__(self) -> str:
        return f"RawBuffer(0x{self.addr:x}, {self.nbytes})"


def new_bytes(n: int) -> Tuple[bytes, int]:
    """A fresh, unshared bytes object of n bytes and its address, for the library to fill.

    Writing into a bytes object before any other code sees it is what C extensions do to
    build bytes without a second copy; ``get()`` returns it only after a hit.
    """
    b = _bytes_new(None, n)
    return b, _bytes_addr(b)


def _in_ranges(ranges: Tuple[Tuple[int, int], ...], addr: int, n: int) -> bool:
    return any(lo <= addr and addr + n <= lo + size for lo, size in ranges)


def _raw_pair(obj: Tuple[Any, ...], what: str) -> Tuple[int, int]:
    if (len(obj) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in obj)
            or obj[0] <= 0 or obj[1] < 0):
        raise DfkvError(f"{what}: a raw region is a (positive address, non-negative size) pair "
                        f"of ints, got {obj!r}")
    return int(obj[0]), int(obj[1])


def _tensor_region(obj: Any, device_ok: bool, device_ranges: Tuple[Tuple[int, int], ...] = ()) -> Tuple[int, int]:
    is_contig = getattr(obj, "is_contiguous", None)
    if callable(is_contig) and not is_contig():
        raise DfkvError(f"{type(obj).__name__} is not contiguous; call .contiguous() first")
    device = getattr(obj, "device", None)
    if isinstance(device, bool):  # RawBuffer(device=True)
        on_device = device
    else:  # torch: tensor.device.type is "cpu", "cuda", ...
        on_device = device is not None and getattr(device, "type", "cpu") != "cpu"
    n = getattr(obj, "nbytes", None)
    if not isinstance(n, int):
        try:
            n = obj.numel() * obj.element_size()
        except AttributeError as e:
            raise DfkvError(
                f"{type(obj).__name__} has data_ptr() but neither nbytes nor numel()/element_size()"
            ) from e
    addr = int(obj.data_ptr())
    if on_device and not device_ok and not _in_ranges(device_ranges, addr, int(n)):
        if device_ranges:
            raise DfkvError(
                f"{type(obj).__name__} at 0x{addr:x} ({n} bytes) lives in device memory outside "
                "every range registered with register_dmabuf; only GETs into registered device "
                "memory are served (by RDMA)")
        raise DfkvError(
            f"{type(obj).__name__} lives in device memory, which the library cannot read or "
            "write with the CPU; use a host (CPU) buffer, or register the device memory with "
            "register_dmabuf and GET into it"
        )
    return addr, int(n)


def nbytes_of(obj: Any) -> int:
    """Size in bytes of a buffer the binding accepts (without pinning it)."""
    if isinstance(obj, bytes):
        return len(obj)
    if hasattr(obj, "data_ptr"):
        return _tensor_region(obj, True)[1]
    try:
        return memoryview(obj).nbytes
    except TypeError as e:
        raise DfkvError(f"{type(obj).__name__} is not a buffer") from e


class Pins:
    """Per-call set of pinned buffers; use as a context manager around the library call."""

    __slots__ = ("_views", "_keep", "device_ok", "device_ranges")

    def __init__(self, device_ok: bool = False, device_ranges: Tuple[Tuple[int, int], ...] = ()):
        self._views: List[_PyBuffer] = []
        self._keep: List[Any] = []
        self.device_ok = device_ok
        # (iova, size) ranges registered with register_dmabuf: device GET destinations
        self.device_ranges = device_ranges

    def __enter__(self) -> "Pins":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Drop every pin taken so far (idempotent)."""
        views, self._views = self._views, []
        for v in views:
            _release_buffer(ctypes.byref(v))
        self._keep.clear()

    def keep(self, obj: Any) -> Any:
        """Keep a ctypes array (or anything) alive until release."""
        self._keep.append(obj)
        return obj

    def _export(self, obj: Any, writable: bool, what: str) -> Tuple[int, int]:
        view = _PyBuffer()
        flags = _PyBUF_C_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
        try:
            _get_buffer(obj, ctypes.byref(view), flags)
        except (BufferError, TypeError, ValueError) as e:
            if isinstance(obj, (bytes, str)) and writable:
                raise DfkvError(f"{what} must be writable (bytearray, memoryview, numpy array, ...)") from e
            raise DfkvError(f"{what}: {type(obj).__name__} is not a usable buffer: {e}") from e
        self._views.append(view)
        return view.buf or 0, view.len

    def read(self, obj: Any, what: str = "value") -> Tuple[int, int]:
        """(address, length) of memory the library will read."""
        if isinstance(obj, bytes):
            # The address of the bytes object's own storage: no copy, and the caller's
            # reference keeps it alive for the call.
            return _bytes_addr(obj) or 0, len(obj)
        if hasattr(obj, "data_ptr"):
            return _tensor_region(obj, self.device_ok)
        if isinstance(obj, str):
            raise DfkvError(f"{what} must be bytes-like, not str (encode it first)")
        return self._export(obj, False, what)

    def write(self, obj: Any, what: str = "buffer") -> Tuple[int, int]:
        """(address, length) of memory the library will write."""
        if type(obj) is tuple:  # (device pointer, size): only inside a registered DMA-BUF
            addr, n = _raw_pair(obj, what)
            if not _in_ranges(self.device_ranges, addr, n):
                raise DfkvError(
                    f"{what}: the raw region (0x{addr:x}, {n}) is not inside a range registered "
                    "with register_dmabuf; raw (ptr, size) destinations name device memory (wrap "
                    "host memory in RawBuffer)")
            return addr, n
        if hasattr(obj, "data_ptr"):
            return _tensor_region(obj, self.device_ok, self.device_ranges)
        if isinstance(obj, (bytes, str)):
            raise DfkvError(f"{what} must be writable (bytearray, memoryview, numpy array, ...), "
                            f"not {type(obj).__name__}")
        return self._export(obj, True, what)
