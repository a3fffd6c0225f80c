"""dfkv._cuda, the ctypes seam over the CUDA driver (libcuda.so.1) that the GPU-direct device
check uses (tools/device/gpu_direct.py). Nothing here skips: without CUDA the tests check the
refusal and its message; with CUDA they move real bytes through device memory."""

from __future__ import annotations

import ctypes
import os

import pytest
from conftest import run_python

from dfkv import _cuda


def _have_libcuda() -> str:
    """"" when libcuda.so.1 loads in this process, else the loader's reason."""
    try:
        ctypes.CDLL(_cuda.LIB_NAME)
    except OSError as e:
        return str(e)
    return ""


def test_import_does_not_load_libcuda():
    r = run_python("import dfkv._cuda as C, sys\n"
                   "maps = open('/proc/self/maps').read()\n"
                   "print('libcuda' in maps, C._cu is None)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_missing_library_is_named():
    # A path that cannot exist: the refusal must name libcuda and the path, on every machine.
    r = run_python(
        "import dfkv._cuda as C\n"
        "try:\n"
        "    C.init()\n"
        "except C.CudaUnavailable as e:\n"
        "    print('REFUSED', e)\n",
        env={"DFKV_CUDA_LIB": "/nonexistent/dfkv-test/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("REFUSED "), r.stdout
    assert "libcuda" in r.stdout and "/nonexistent/dfkv-test/libcuda.so.1" in r.stdout


def test_export_refuses_unaligned_range_before_cuda():
    page = os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(ValueError, match=f"host page size {page}"):
        _cuda.export_dmabuf(page + 1, page)
    with pytest.raises(ValueError, match="not aligned"):
        _cuda.export_dmabuf(2 * page, page + 512)
    assert _cuda.round_up(1) == _cuda.EXPORT_ALIGN
    assert _cuda.round_up(_cuda.EXPORT_ALIGN) == _cuda.EXPORT_ALIGN
    assert _cuda.EXPORT_ALIGN % page == 0


def test_cuda_constants_match_cuda_h():
    assert _cuda.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == 1
    assert _cuda.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED == 124
    assert _cuda.CUDA_ERROR_NOT_SUPPORTED == 801
    e = _cuda.CudaError("cuMemGetHandleForAddressRange", 801, "CUDA_ERROR_NOT_SUPPORTED")
    assert "801" in str(e) and "CUDA_ERROR_NOT_SUPPORTED" in str(e) and e.code == 801


def test_this_machine():
    """Without libcuda: CudaUnavailable naming libcuda. With it: a device round trip (or, on
    a driver without a GPU, cuInit's refusal with the CUDA error named)."""
    why = _have_libcuda()
    if why:
        with pytest.raises(_cuda.CudaUnavailable, match="libcuda") as ei:
            _cuda.init()
        assert _cuda.LIB_NAME in str(ei.value)
        return
    try:
        _cuda.init()
    except _cuda.CudaUnavailable as e:
        assert "CUDA error" in str(e) or "no CUDA device" in str(e), str(e)
        return
    assert _cuda.device_name()
    assert _cuda.driver_version() > 0
    n = 3 << 20
    ptr = _cuda.mem_alloc(_cuda.round_up(n))
    try:
        data = os.urandom(n)
        _cuda.memcpy_htod(ptr, data)
        assert _cuda.memcpy_dtoh(ptr, n) == data
        _cuda.memcpy_htod(ptr, bytearray(b"\x5a" * 4096))  # a writable buffer too
        assert _cuda.memcpy_dtoh(ptr, 4096) == b"\x5a" * 4096
        supported = _cuda.dmabuf_supported()
        assert supported in (0, 1)
        try:
            fd = _cuda.export_dmabuf(ptr, _cuda.round_up(n))
        except _cuda.CudaError as e:
            assert e.code != 0 and e.name.startswith("CUDA_ERROR"), str(e)
        else:
            assert fd >= 0
            os.close(fd)
    finally:
        _cuda.mem_free(ptr)
