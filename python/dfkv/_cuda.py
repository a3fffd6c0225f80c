"""A small seam over the CUDA driver API (``libcuda.so.1``), loaded at run time with ctypes.

Like libibverbs for the RDMA provider, the CUDA driver is never linked: it is dlopen'ed on
the first call that needs it, so importing this module costs nothing and works on machines
without a GPU. What it offers is what a GPU-direct load needs (issue 32; docs/RDMA.md,
"GPU-direct loads: device check"):

* ``init()``: ``cuInit(0)``, then device 0's primary context, retained and made current for
  the calling thread (a CUDA context is per thread: call ``init()`` in each thread that uses
  the helpers below).
* ``export_dmabuf(ptr, size) -> fd``: ``cuMemGetHandleForAddressRange(&fd, ptr, size,
  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags)``, the DMA-BUF an RDMA NIC can register
  (``ibv_reg_dmabuf_mr``) so the server's RDMA WRITEs land in GPU memory. **Alignment:** the
  driver wants ``ptr`` and ``size`` aligned to the host page size (CUDA driver API,
  cuMemGetHandleForAddressRange); ``export_dmabuf`` refuses other ranges with ValueError
  before calling CUDA. ``cuMemAlloc`` of a size that is a multiple of ``EXPORT_ALIGN``
  (2 MiB, the GPU's large page, a multiple of every host page size Linux uses) gives an
  exportable range; ``round_up`` helps size it.
* ``dmabuf_supported()``: the device attribute ``CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED``
  (1 on data-center GPUs with the open kernel module and a kernel with DMA-BUF; 0 elsewhere).
  Consumer GPUs refuse the export with ``CUDA_ERROR_NOT_SUPPORTED`` (801).
* ``mem_alloc`` / ``mem_free`` / ``memcpy_htod`` / ``memcpy_dtoh`` / ``device_name`` /
  ``driver_version``: plain driver calls (synchronous copies).

Errors: ``CudaUnavailable`` when there is no usable CUDA here (no ``libcuda.so.1``, a driver
without a symbol, ``cuInit`` failing, e.g. ``CUDA_ERROR_NO_DEVICE``); ``CudaError`` (with
``code``, ``name`` and ``call``) when a driver call fails. Both say the CUDA error code and
its name (``cuGetErrorName``). ``$DFKV_CUDA_LIB`` overrides the library path (tests).
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p
from typing import Any, Optional

__all__ = [
    "CUDA_ERROR_NOT_SUPPORTED",
    "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED",
    "CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE",
    "CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD",
    "CudaError",
    "CudaUnavailable",
    "EXPORT_ALIGN",
    "LIB_NAME",
    "device_name",
    "dmabuf_supported",
    "driver_version",
    "export_dmabuf",
    "init",
    "mem_alloc",
    "mem_free",
    "memcpy_dtoh",
    "memcpy_htod",
    "round_up",
]

LIB_NAME = "libcuda.so.1"

# From CUDA's cuda.h (CUDA 11.7+ for the first three; the PCIe mapping flag is CUDA 12.8+,
# and older drivers answer CUDA_ERROR_INVALID_VALUE to any nonzero flags).
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1  # CUmemRangeHandleType
CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 0x1  # CUmemRangeFlags
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124  # CUdevice_attribute
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_SUPPORTED = 801

EXPORT_ALIGN = 2 << 20

# The few names printed when cuGetErrorName itself is unavailable.
_KNOWN = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    801: "CUDA_ERROR_NOT_SUPPORTED",
}

_PROTOTYPES = {
    "cuInit": [c_uint],
    "cuDriverGetVersion": [POINTER(c_int)],
    "cuDeviceGetCount": [POINTER(c_int)],
    "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int],
    "cuCtxSetCurrent": [c_void_p],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [POINTER(c_uint64), c_size_t],
    "cuMemFree_v2": [c_uint64],
    "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
    "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
}
# Looked up separately: a driver older than CUDA 11.7 lacks it, and everything else still works.
_EXPORT_FN = "cuMemGetHandleForAddressRange"


class CudaUnavailable(RuntimeError):
    """No usable CUDA on this machine: no libcuda.so.1, a driver without a needed symbol, or
    cuInit / device 0 failing (the message says which, with the CUDA error code and name)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed: ``call`` (the function), ``code`` (CUresult) and ``name``
    (``cuGetErrorName``, e.g. CUDA_ERROR_NOT_SUPPORTED for 801)."""

    def __init__(self, call: str, code: int, name: str, detail: str = ""):
        self.call, self.code, self.name = call, code, name
        super().__init__(f"{call} failed: CUDA error {code} {name}" + (f" ({detail})" if detail else ""))


_lock = threading.Lock()
_cu: Optional[ctypes.CDLL] = None
_device: Optional[int] = None
_ctx: Optional[int] = None


def _lib_path() -> str:
    return os.environ.get("DFKV_CUDA_LIB") or LIB_NAME


def _load() -> ctypes.CDLL:
    global _cu
    with _lock:
        if _cu is not None:
            return _cu
        path = _lib_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise CudaUnavailable(
                f"cannot load the CUDA driver library {path} (libcuda, from the NVIDIA driver; "
                f"no CUDA GPU driver here?): {e}") from e
        for name, argtypes in _PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise CudaUnavailable(f"{path} (libcuda) lacks {name}: not a usable CUDA driver") from e
            fn.restype = c_int
            fn.argtypes = argtypes
        if hasattr(lib, _EXPORT_FN):
            fn = getattr(lib, _EXPORT_FN)
            fn.restype = c_int
            fn.argtypes = [c_void_p, c_uint64, c_size_t, c_int, c_ulonglong]
        _cu = lib
        return lib


def error_name(code: int) -> str:
    """``cuGetErrorName(code)``, or a built-in name when the driver cannot say."""
    cu = _cu
    if cu is not None:
        s = c_char_p()
        if cu.cuGetErrorName(code, byref(s)) == CUDA_SUCCESS and s.value:
            return s.value.decode("ascii", "replace")
    return _KNOWN.get(code, "CUDA_ERROR_UNKNOWN_CODE")


def _check(call: str, code: int, detail: str = "") -> None:
    if code != CUDA_SUCCESS:
        raise CudaError(call, code, error_name(code), detail)


def init() -> int:
    """cuInit(0), device 0's primary context retained (once) and made current for this
    thread. Returns the device ordinal (0). CudaUnavailable when CUDA cannot start here."""
    global _device, _ctx
    cu = _load()
    with _lock:
        if _ctx is None:
            rc = cu.cuInit(0)
            if rc != CUDA_SUCCESS:
                raise CudaUnavailable(f"cuInit(0) failed: CUDA error {rc} {error_name(rc)} "
                                      f"({_lib_path()} loaded, but no usable GPU)")
            n = c_int(0)
            _check("cuDeviceGetCount", cu.cuDeviceGetCount(byref(n)))
            if n.value < 1:
                raise CudaUnavailable("cuDeviceGetCount: no CUDA device")
            dev = c_int(0)
            _check("cuDeviceGet(0)", cu.cuDeviceGet(byref(dev), 0))
            ctx = c_void_p()
            _check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(byref(ctx), dev))
            _device, _ctx = dev.value, ctx.value
    _check("cuCtxSetCurrent", cu.cuCtxSetCurrent(_ctx))
    return 0


def _ready() -> ctypes.CDLL:
    if _ctx is None:
        init()
    assert _cu is not None
    return _cu


def driver_version() -> int:
    """cuDriverGetVersion: e.g. 12040 for CUDA 12.4 (no init needed)."""
    cu = _load()
    v = c_int(0)
    _check("cuDriverGetVersion", cu.cuDriverGetVersion(byref(v)))
    return v.value


def device_name() -> str:
    """Device 0's name (cuDeviceGetName), e.g. 'NVIDIA H200'."""
    cu = _ready()
    buf = ctypes.create_string_buffer(256)
    _check("cuDeviceGetName", cu.cuDeviceGetName(buf, len(buf), _device))
    return buf.value.decode("utf-8", "replace")


def device_attribute(attr: int) -> int:
    cu = _ready()
    v = c_int(0)
    _check(f"cuDeviceGetAttribute({attr})", cu.cuDeviceGetAttribute(byref(v), attr, _device))
    return v.value


def dmabuf_supported() -> int:
    """CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of device 0: 1 when the device can export
    DMA-BUFs, else 0 (a driver too old for the attribute answers CUDA_ERROR_INVALID_VALUE)."""
    return device_attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)


def round_up(n: int, align: int = EXPORT_ALIGN) -> int:
    return (n + align - 1) // align * align


def mem_alloc(size: int) -> int:
    """cuMemAlloc: a device pointer to ``size`` bytes (uninitialized)."""
    if size <= 0:
        raise ValueError(f"mem_alloc: size must be positive, not {size}")
    cu = _ready()
    p = c_uint64(0)
    _check("cuMemAlloc", cu.cuMemAlloc_v2(byref(p), size), f"{size} bytes")
    return p.value


def mem_free(ptr: int) -> None:
    cu = _ready()
    _check("cuMemFree", cu.cuMemFree_v2(ptr), f"0x{ptr:x}")


def memcpy_htod(ptr: int, data: Any) -> None:
    """Copy ``data`` (bytes or any C-contiguous buffer) to device memory at ``ptr``
    (synchronous)."""
    cu = _ready()
    if isinstance(data, bytes):
        src, n, keep = c_char_p(data), len(data), data
        rc = cu.cuMemcpyHtoD_v2(ptr, ctypes.cast(src, c_void_p), n)
    else:
        mv = memoryview(data).cast("B")
        n = mv.nbytes
        if mv.readonly:
            keep = bytes(mv)
            rc = cu.cuMemcpyHtoD_v2(ptr, ctypes.cast(c_char_p(keep), c_void_p), n)
        else:
            keep = (ctypes.c_char * n).from_buffer(mv)
            rc = cu.cuMemcpyHtoD_v2(ptr, ctypes.addressof(keep), n)
    del keep
    _check("cuMemcpyHtoD", rc, f"{n} bytes to 0x{ptr:x}")


def memcpy_dtoh(ptr: int, size: int) -> bytes:
    """``size`` bytes of device memory at ``ptr``, copied to a new bytes object."""
    cu = _ready()
    out = bytearray(size)
    if size:
        dst = (ctypes.c_char * size).from_buffer(out)
        rc = cu.cuMemcpyDtoH_v2(ctypes.addressof(dst), ptr, size)
        del dst
        _check("cuMemcpyDtoH", rc, f"{size} bytes from 0x{ptr:x}")
    return bytes(out)


def export_dmabuf(ptr: int, size: int, flags: int = 0) -> int:
    """A DMA-BUF file descriptor for device memory [ptr, ptr+size) (the caller closes it).

    ``ptr`` and ``size`` must be multiples of the host page size (ValueError otherwise,
    before CUDA is called). Raises CudaError on the driver's refusal (801
    CUDA_ERROR_NOT_SUPPORTED on consumer GPUs and drivers without DMA-BUF), CudaUnavailable
    when the driver predates cuMemGetHandleForAddressRange (CUDA 11.7)."""
    page = os.sysconf("SC_PAGE_SIZE")
    if size <= 0 or ptr % page or size % page:
        raise ValueError(
            f"export_dmabuf: range 0x{ptr:x}+{size} is not aligned to the host page size {page} "
            f"(cuMemGetHandleForAddressRange needs page-aligned start and size; allocate "
            f"round_up(n) bytes)")
    cu = _ready()
    if not hasattr(cu, _EXPORT_FN):
        raise CudaUnavailable(f"{_lib_path()} lacks {_EXPORT_FN} (needs a CUDA 11.7+ driver)")
    fd = c_int(-1)
    rc = getattr(cu, _EXPORT_FN)(byref(fd), ptr, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags)
    _check(_EXPORT_FN, rc, f"DMA_BUF_FD of 0x{ptr:x}+{size}, flags {flags}")
    if fd.value < 0:
        raise CudaError(_EXPORT_FN, rc, error_name(rc), f"returned fd {fd.value}")
    return fd.value
