"""Zero-copy buffer handling (no library needed): addresses must point at the caller's own
memory, writes need writable memory, and non-contiguous or foreign objects are refused."""

from __future__ import annotations

import array
import ctypes
import mmap

import pytest

from dfkv import DfkvError, RawBuffer, nbytes_of
from dfkv._buffers import Pins, new_bytes

try:
    import numpy as np
except ImportError:  # numpy is optional; only its tests skip
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="numpy not importable")


def test_bytes_read_is_zero_copy():
    b = b"hello\x00world"
    with Pins() as p:
        addr, n = p.read(b)
        assert n == len(b)
        assert ctypes.string_at(addr, n) == b
        # Same storage: the address is inside the bytes object itself.
        assert id(b) < addr < id(b) + 64


def test_bytearray_write_is_zero_copy_and_pinned():
    ba = bytearray(8)
    with Pins() as p:
        addr, n = p.write(ba)
        ctypes.memmove(addr, b"ABCDEFGH", 8)
        with pytest.raises(BufferError):
            ba.extend(b"x")  # exported buffers cannot move during the call
    assert ba == b"ABCDEFGH"
    ba.extend(b"x")  # released afterwards


@pytest.mark.parametrize("make", [
    lambda: memoryview(bytearray(b"0123456789"))[2:7],
    lambda: array.array("i", [1, 2, 3]),
])
def test_other_writable_buffers(make):
    obj = make()
    with Pins() as p:
        addr, n = p.write(obj)
        assert n == memoryview(obj).nbytes
        ctypes.memset(addr, 0x41, n)
    assert bytes(memoryview(obj)) == b"A" * n


def test_mmap_buffer():
    m = mmap.mmap(-1, 4096)
    with Pins() as p:
        addr, n = p.write(m)
        assert n == 4096
        ctypes.memset(addr, 7, 1)
    assert m[0] == 7
    m.close()


def test_read_only_buffers_readable_not_writable():
    mv = memoryview(b"abcdef")[1:4]
    with Pins() as p:
        addr, n = p.read(mv)
        assert ctypes.string_at(addr, n) == b"bcd"
        for ro in (b"x", mv, "str"):
            with pytest.raises(DfkvError):
                p.write(ro)


def test_non_contiguous_and_non_buffers_refused():
    mv = memoryview(bytearray(16))[::2]
    with Pins() as p:
        with pytest.raises(DfkvError):
            p.write(mv)
        with pytest.raises(DfkvError):
            p.read(mv)
        with pytest.raises(DfkvError):
            p.read("text")
        with pytest.raises(DfkvError):
            p.read(12345)


def test_new_bytes_is_writable_fresh_storage():
    b, addr = new_bytes(5)
    ctypes.memmove(addr, b"abcde", 5)
    assert b == b"abcde" and isinstance(b, bytes)
    one, addr1 = new_bytes(1)  # never CPython's shared one-character bytes
    ctypes.memmove(addr1, b"z", 1)
    assert one == b"z" and bytes([0x7A]) == b"z" and new_bytes(1)[0] is not one


class FakeTensor:
    """Quacks like a torch tensor (data_ptr/numel/element_size/is_contiguous/device)."""

    class _Dev:
        def __init__(self, t):
            self.type = t

    def __init__(self, n, contiguous=True, device="cpu"):
        self.buf = (ctypes.c_float * n)()
        self._contig = contiguous
        self.device = self._Dev(device)

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def numel(self):
        return len(self.buf)

    def element_size(self):
        return 4

    def is_contiguous(self):
        return self._contig


def test_tensor_like_objects():
    t = FakeTensor(4)
    with Pins() as p:
        assert p.write(t) == (t.data_ptr(), 16)
        assert p.read(t) == (t.data_ptr(), 16)
        with pytest.raises(DfkvError, match="contiguous"):
            p.write(FakeTensor(4, contiguous=False))
        with pytest.raises(DfkvError, match="device"):
            p.read(FakeTensor(4, device="cuda"))
    with Pins(device_ok=True) as p:
        assert p.read(FakeTensor(2, device="cuda"))[1] == 8
    assert nbytes_of(t) == 16


def test_raw_buffer():
    buf = ctypes.create_string_buffer(32)
    rb = RawBuffer(ctypes.addressof(buf), 32)
    with Pins() as p:
        assert p.write(rb) == (ctypes.addressof(buf), 32)
        with pytest.raises(DfkvError):
            p.write(RawBuffer(ctypes.addressof(buf), 32, device=True))
    with pytest.raises(DfkvError):
        RawBuffer(0, 1)
    with pytest.raises(DfkvError):
        RawBuffer(1, -1)


@needs_numpy
def test_numpy_arrays_zero_copy():
    a = np.zeros((4, 8), dtype=np.uint16)
    with Pins() as p:
        addr, n = p.write(a)
        assert addr == a.ctypes.data and n == a.nbytes
        ctypes.memset(addr, 1, n)
    assert (a == 0x0101).all()
    ro = np.arange(4, dtype=np.int64)
    ro.flags.writeable = False
    with Pins() as p:
        assert p.read(ro) == (ro.ctypes.data, 32)
        with pytest.raises(DfkvError):
            p.write(ro)
        with pytest.raises(DfkvError):
            p.write(a[:, ::2])  # non-contiguous view
        assert p.write(a[1])[0] == a.ctypes.data + 16  # contiguous row view, same memory
