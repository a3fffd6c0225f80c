package ramtier

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vmFlags returns the VmFlags of the mapping that contains addr (/proc/self/smaps). The
// kernel may have merged the arena with a neighbouring mapping of the same flags, so the
// mapping is found by containment, not by its start.
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = uintptr(l) <= addr && addr < uintptr(h)
				continue
			}
		}
		if in && fields[0] == "VmFlags:" {
			return fields[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("no mapping holds %#x in /proc/self/smaps", addr)
	return nil
}

// resident counts the pages of b that are in memory (mincore).
func resident(t *testing.T, b []byte) (in, all int) {
	t.Helper()
	pg := os.Getpagesize()
	vec := make([]byte, (len(b)+pg-1)/pg)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			in++
		}
	}
	return in, len(vec)
}

// thpBuiltIn reports whether the kernel has transparent huge pages at all (the sysfs
// directory exists even when the mode is "never"; MADV_HUGEPAGE is accepted then).
func thpBuiltIn() bool {
	_, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil
}

func TestMapArena(t *testing.T) {
	const n = 6<<20 + 12<<10 // not a multiple of the huge page
	for _, huge := range []bool{true, false} {
		t.Run(fmt.Sprintf("huge=%v", huge), func(t *testing.T) {
			b, err := mapArena(n, huge)
			if err != nil {
				t.Fatal(err)
			}
			addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if len(b) != n {
				t.Fatalf("arena of %d bytes, asked %d", len(b), n)
			}
			if in, all := resident(t, b); in != all {
				t.Errorf("%d of %d pages resident right after mapping: not populated", in, all)
			}
			flags := vmFlags(t, addr)
			if huge {
				if addr%hugePageSize() != 0 {
					t.Errorf("arena at %#x, not aligned to the %d-byte huge page", addr, hugePageSize())
				}
				if got, want := slices.Contains(flags, "hg"), thpBuiltIn(); got != want {
					t.Errorf("VmFlags %v: huge-page advice (hg) %v, want %v", flags, got, want)
				}
			} else if slices.Contains(flags, "hg") {
				t.Errorf("VmFlags %v: huge-page advice on a mapping that did not ask for it", flags)
			}
			for i := range b { // writable end to end
				b[i] = byte(i)
			}
			if want := byte((n - 1) & 0xff); b[n-1] != want {
				t.Fatal("last byte did not stick")
			}
			if err := unmapArena(b); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := mapArena(0, true); err == nil {
		t.Error("an empty arena was mapped")
	}
}

// TestMapArenaPopulateFallbacks covers the kernels without MADV_POPULATE_WRITE (EINVAL:
// every page is written instead) and a populate that fails for want of memory (the
// mapping is refused, with the cause, and not left behind).
func TestMapArenaPopulateFallbacks(t *testing.T) {
	orig := madvisePopulate
	t.Cleanup(func() { madvisePopulate = orig })
	const n = 4 << 20

	madvisePopulate = func([]byte) error { return unix.EINVAL }
	b, err := mapArena(n, true)
	if err != nil {
		t.Fatalf("EINVAL from MADV_POPULATE_WRITE: %v", err)
	}
	if in, all := resident(t, b); in != all {
		t.Errorf("fallback left %d of %d pages out", all-in, all)
	}
	if err := unmapArena(b); err != nil {
		t.Fatal(err)
	}

	var seen []byte
	madvisePopulate = func(b []byte) error { seen = b; return unix.ENOMEM }
	b, err = mapArena(n, true)
	if !errors.Is(err, unix.ENOMEM) || b != nil {
		t.Fatalf("ENOMEM from MADV_POPULATE_WRITE: got (%d bytes, %v), want the error", len(b), err)
	}
	// The refused range is unmapped: mincore on it fails with ENOMEM.
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(seen))), uintptr(len(seen)),
		uintptr(unsafe.Pointer(&make([]byte, len(seen)/os.Getpagesize())[0]))); e != unix.ENOMEM {
		t.Errorf("mincore on the refused arena: %v, want ENOMEM (still mapped)", e)
	}
}

// BenchmarkArenaCopy1MiB copies 1 MiB values out of a 256 MiB arena mapped with and
// without the huge-page advice: the TLB cost that every warm GET pays on the arena side.
func BenchmarkArenaCopy1MiB(b *testing.B) {
	const arenaBytes = 256 << 20
	dst := make([]byte, benchSize)
	for _, huge := range []bool{false, true} {
		b.Run(fmt.Sprintf("huge=%v", huge), func(b *testing.B) {
			a, err := mapArena(arenaBytes, huge)
			if err != nil {
				b.Fatal(err)
			}
			defer unmapArena(a)
			slots := arenaBytes / benchSize
			b.SetBytes(benchSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := (i * 97 % slots) * benchSize // spread over the arena, like a key space
				copy(dst, a[off:off+benchSize])
			}
		})
	}
}
