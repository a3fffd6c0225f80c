package devmem

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kinds of Mem.
const (
	KindUDMABuf = "udmabuf" // a dma-buf exported by /dev/udmabuf over a sealed memfd
	KindMemfd   = "memfd"   // a plain memfd: a DMA-BUF only to the soft provider
)

// ErrNoUDMABuf: this kernel cannot make a udmabuf of the size asked (no /dev/udmabuf, or
// over the udmabuf module's size_limit_mb).
var ErrNoUDMABuf = errors.New("devmem: no udmabuf")

// Mem is one stand-in device allocation.
type Mem struct {
	FD   int    // what RegisterDMABuf takes: the dma-buf (udmabuf) or the memfd
	Mem  []byte // the test's own shared mapping of the same pages (never registered as host memory)
	IOVA uint64 // the address the allocation is named by: &Mem[0]
	Kind string // KindUDMABuf or KindMemfd
	Why  string // for KindMemfd from New: why not a udmabuf
}

// udmabufCreate is UDMABUF_CREATE (_IOW('u', 0x42, struct udmabuf_create)).
const udmabufCreate = 0x40187542

// New returns size bytes of stand-in device memory, a udmabuf where the kernel can make
// one, else a memfd, and logs which. Everything is released at the end of the test.
func New(t testing.TB, size int) *Mem {
	t.Helper()
	m, err := UDMABuf(t, size)
	if err == nil {
		t.Logf("device memory stand-in: %s, %d bytes", m.Kind, size)
		return m
	}
	if !errors.Is(err, ErrNoUDMABuf) {
		t.Fatal(err)
	}
	m = Memfd(t, size)
	m.Why = err.Error()
	t.Logf("device memory stand-in: %s, %d bytes (%s)", m.Kind, size, m.Why)
	return m
}

// Memfd returns size bytes of a memfd, mapped shared, as device memory (Kind KindMemfd).
func Memfd(t testing.TB, size int) *Mem {
	t.Helper()
	fd, err := unix.MemfdCreate("dfkv-dev", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	return newMem(t, fd, fd, size, KindMemfd)
}

// UDMABuf returns size bytes of a udmabuf (Kind KindUDMABuf); the error wraps ErrNoUDMABuf
// when this kernel cannot make one of that size. Other failures fail t.
func UDMABuf(t testing.TB, size int) (*Mem, error) {
	t.Helper()
	u, err := unix.Open("/dev/udmabuf", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open /dev/udmabuf: %w", ErrNoUDMABuf, err)
	}
	defer unix.Close(u)
	if lim := sizeLimit(); lim > 0 && int64(size) > lim {
		return nil, fmt.Errorf("%w: %d bytes is over udmabuf's size_limit_mb (%d MiB)", ErrNoUDMABuf, size, lim>>20)
	}
	mfd, err := unix.MemfdCreate("dfkv-udmabuf", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(mfd) })
	if err := unix.Ftruncate(mfd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	arg := struct {
		memfd, flags uint32
		offset, size uint64
	}{memfd: uint32(mfd), flags: 1 /* UDMABUF_FLAGS_CLOEXEC */, size: uint64(size)}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(u), udmabufCreate, uintptr(unsafe.Pointer(&arg)))
	if errno != 0 {
		t.Fatalf("UDMABUF_CREATE of %d bytes: %v", size, errno)
	}
	t.Cleanup(func() { unix.Close(int(fd)) })
	return newMem(t, int(fd), mfd, size, KindUDMABuf), nil
}

// sizeLimit is the udmabuf module's size_limit_mb in bytes (0: unknown).
func sizeLimit() int64 {
	b, err := os.ReadFile("/sys/module/udmabuf/parameters/size_limit_mb")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n << 20
}

// newMem maps the memfd mfd shared as the test's view of the allocation fd names.
func newMem(t testing.TB, fd, mfd, size int, kind string) *Mem {
	t.Helper()
	m, err := unix.Mmap(mfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return &Mem{FD: fd, Mem: m, IOVA: uint64(uintptr(unsafe.Pointer(&m[0]))), Kind: kind}
}

// Fill sets every byte to b (poisoning the allocation).
func (m *Mem) Fill(b byte) {
	for i := range m.Mem {
		m.Mem[i] = b
	}
}
