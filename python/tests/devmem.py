"""The tests' stand-in for a GPU allocation (issue 32's DMA-BUF tests): one interface, two kinds.

* ``udmabuf`` where the kernel has ``/dev/udmabuf`` (and this user may open it): a real
  DMA-BUF made from a sealed memfd (``UDMABUF_CREATE``), the kernel's own stand-in for device
  memory. ``fd`` is the DMA-BUF; ``mem`` maps the memfd, i.e. the same pages.
* ``memfd`` elsewhere (e.g. Debian 12's 6.1 kernel without udmabuf): ``fd`` is the memfd itself,
  which only the soft RDMA provider accepts as a "DMA-BUF" (it maps the fd).

Either way a test registers ``fd`` (``Client.register_dmabuf(dev.fd, 0, dev.size, dev.addr)``)
and checks bytes in ``mem``, its own mapping: bytes the NIC writes show up there, never through
a host staging copy. ``kind()`` says which kind this host gets (test ids carry it); a host with
a usable /dev/udmabuf whose UDMABUF_CREATE fails raises: no silent fall back to a memfd.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct

UDMABUF_DEV = "/dev/udmabuf"
# struct udmabuf_create { __u32 memfd; __u32 flags; __u64 offset; __u64 size; } (24 bytes)
_UDMABUF_CREATE_FMT = "=IIQQ"
# UDMABUF_CREATE = _IOW('u', 0x42, struct udmabuf_create): write dir (1) << 30 | size << 16 |
# type << 8 | nr = 0x40187542 (go/e2e/rdma_direct_linux_test.go uses the same number)
UDMABUF_CREATE = (1 << 30) | (struct.calcsize(_UDMABUF_CREATE_FMT) << 16) | (ord("u") << 8) | 0x42
UDMABUF_FLAGS_CLOEXEC = 0x01
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)

assert UDMABUF_CREATE == 0x40187542


def kind() -> str:
    """'udmabuf' where /dev/udmabuf exists and may be opened read-write, else 'memfd'; with
    DFKV_TEST_REQUIRE_UDMABUF=1 (the Soft-RoCE guest, whose kernel has it) no udmabuf is an
    error, not a memfd."""
    if os.access(UDMABUF_DEV, os.R_OK | os.W_OK):
        return "udmabuf"
    if os.environ.get("DFKV_TEST_REQUIRE_UDMABUF") == "1":
        raise RuntimeError(f"DFKV_TEST_REQUIRE_UDMABUF=1 but {UDMABUF_DEV} cannot be opened read-write")
    return "memfd"


class DeviceMemory:
    """``size`` bytes (rounded up to whole pages) of stand-in device memory.

    ``kind``: 'udmabuf' or 'memfd'; ``fd``: the descriptor to register as a DMA-BUF (owned
    here; ``export()`` gives a dup the caller owns); ``mem``: a shared read-write mapping of
    the memory (``addr``: its address, the iova tests register it under)."""

    def __init__(self, size: int, name: str = "dfkv-test-devmem", kind_: str | None = None):
        self.kind = kind_ or kind()
        if self.kind not in ("udmabuf", "memfd"):
            raise ValueError(f"device memory kind {self.kind!r}")
        self.size = -(-int(size) // mmap.PAGESIZE) * mmap.PAGESIZE  # udmabuf wants whole pages
        self.fd = -1
        self._memfd = os.memfd_create(name, os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if self.kind == "udmabuf" else 0))
        try:
            os.ftruncate(self._memfd, self.size)
            if self.kind == "udmabuf":
                self.fd = self._udmabuf(self._memfd, self.size)
            else:
                self.fd = os.dup(self._memfd)
            self.mem = mmap.mmap(self._memfd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self.close()
            raise
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))

    @staticmethod
    def _udmabuf(memfd: int, size: int) -> int:
        # the kernel refuses a memfd that could shrink under the DMA-BUF
        fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK)
        arg = bytearray(struct.pack(_UDMABUF_CREATE_FMT, memfd, UDMABUF_FLAGS_CLOEXEC, 0, size))
        dev = os.open(UDMABUF_DEV, os.O_RDWR | os.O_CLOEXEC)
        try:
            # mutate_flag=True: ioctl's own return value comes back, the new DMA-BUF fd
            # (with False, Python returns a copy of the buffer instead)
            return fcntl.ioctl(dev, UDMABUF_CREATE, arg, True)
        except OSError as e:
            raise OSError(e.errno, f"UDMABUF_CREATE of {size} bytes: {e.strerror}") from e
        finally:
            os.close(dev)

    def export(self) -> int:
        """A new descriptor of the DMA-BUF, for a caller that closes what it is given."""
        return os.dup(self.fd)

    def close_fd(self) -> None:
        """Close the DMA-BUF descriptor (a registration holds its own reference); the mapping
        stays."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        m = getattr(self, "mem", None)
        if m is not None:
            try:
                m.close()
            except BufferError:  # a torch view still exports it: leave it to the GC
                pass
        self.close_fd()
        if self._memfd >= 0:
            os.close(self._memfd)
            self._memfd = -1

    def __enter__(self) -> "DeviceMemory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeviceMemory({self.kind}, {self.size} bytes at 0x{self.addr:x}, fd {self.fd})"
