package ramtier

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/sysfs"
)

// mapArena maps n bytes of anonymous memory for an arena and faults it in, so that the
// first writes into it take no page faults on the request path.
//
// With huge set, the mapping starts on a huge-page boundary and is advised
// (MADV_HUGEPAGE) to be backed by transparent huge pages. Every GET copies a value out of
// the arena and every PUT into it; with 4 KiB pages a 1 MiB copy crosses 256 pages, each a
// TLB miss and, on a virtual machine, a two-level page walk. The advice takes effect where
// the kernel's THP mode is "always" or "madvise" (the common default); elsewhere, or when
// no huge page is free, the kernel backs the range with 4 KiB pages as before.
func mapArena(n int, huge bool) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("no arena of %d bytes", n)
	}
	align := uintptr(0)
	if huge {
		align = hugePageSize()
	}
	// Over-map by one huge page, then trim to an aligned start: mmap only promises 4 KiB
	// alignment, and the partial huge pages at both ends of an unaligned range stay small.
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(n)+align, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	start := p
	if align > 0 {
		head := (align - uintptr(p)%align) % align
		start = unsafe.Add(p, head)
		if head > 0 {
			_ = unix.MunmapPtr(p, head)
		}
		if tail := align - head; tail > 0 {
			_ = unix.MunmapPtr(unsafe.Add(start, n), tail)
		}
	}
	arena := unsafe.Slice((*byte)(start), n)
	if huge {
		// EINVAL: a kernel built without THP. The arena works on small pages.
		_ = unix.Madvise(arena, unix.MADV_HUGEPAGE)
	}
	if err := populate(arena); err != nil {
		_ = unmapArena(arena)
		return nil, fmt.Errorf("fault in: %w", err)
	}
	return arena, nil
}

// madvisePopulate is MADV_POPULATE_WRITE (a seam for tests).
var madvisePopulate = func(b []byte) error { return unix.Madvise(b, unix.MADV_POPULATE_WRITE) }

// populate faults every page of b in (writable): MADV_POPULATE_WRITE, or on kernels
// before 5.14, which reject it with EINVAL, a write to each page. Any other failure (no
// memory for the arena) is the caller's error: better refused at start than a server that
// dies of it under load.
func populate(b []byte) error {
	err := madvisePopulate(b)
	if !errors.Is(err, unix.EINVAL) {
		return err
	}
	pg := os.Getpagesize()
	for i := 0; i < len(b); i += pg {
		b[i] = 0
	}
	return nil
}

func unmapArena(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}

// hugePageSize is the size of a transparent huge page (2 MiB on x86-64; larger on some
// arm64 kernels), 2 MiB when the kernel does not say.
var hugePageSize = sync.OnceValue(func() uintptr {
	const def = 2 << 20
	v, err := sysfs.Int("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
	if err != nil || v <= 0 || v&(v-1) != 0 || v > 1<<30 {
		return def
	}
	return uintptr(v)
})
