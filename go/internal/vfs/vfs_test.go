//go:build linux

package vfs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/store"
)

func alignedBuf(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestOSFile(t *testing.T) {
	dir := t.TempDir()
	f, err := Default.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Allocate(1 << 20); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Stat(); err != nil || st.Size != 1<<20 {
		t.Fatalf("Stat after Allocate = %+v, %v", st, err)
	}
	if _, err := f.WriteAt([]byte("hello"), 8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := f.ReadAt(got, 8192); err != nil || string(got) != "hello" {
		t.Fatalf("ReadAt = %q, %v", got, err)
	}
	if _, err := f.ReadAt(make([]byte, 10), 1<<20-5); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadAt past the end = %v, want io.ErrUnexpectedEOF", err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	if err := f.PunchHole(0, 1<<20); err != nil {
		t.Fatalf("PunchHole: %v", err)
	}
	if segs := f.DataSegments(1 << 20); len(segs) != 0 {
		t.Fatalf("DataSegments after punching everything = %v", segs)
	}
	lk, err := Default.Lock(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(filepath.Join(dir, "lock")); err == nil {
		t.Fatal("a second Lock on a held lock succeeded")
	}
	lk.Close()
	lk2, err := Lock(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	lk2.Close()
}

func TestInjector(t *testing.T) {
	dir := t.TempDir()
	in := NewInjector(Default)
	path := filepath.Join(dir, "data")
	f, err := in.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Allocate(4096); err != nil {
		t.Fatal(err)
	}

	// Skip and Times: the 2nd and 3rd writes fail, the others pass.
	in.Inject(Fault{Ops: OpWrite, Path: "data", Err: syscall.EIO, Skip: 1, Times: 2})
	var errs []bool
	for i := range 5 {
		_, err := f.WriteAt([]byte{byte(i)}, int64(i))
		errs = append(errs, err != nil)
		if err != nil && !errors.Is(err, syscall.EIO) {
			t.Fatalf("write %d: %v, want EIO", i, err)
		}
	}
	if want := []bool{false, true, true, false, false}; !slices.Equal(errs, want) {
		t.Fatalf("write failures = %v, want %v", errs, want)
	}
	if in.Injected() != 2 {
		t.Fatalf("Injected = %d, want 2", in.Injected())
	}
	in.Reset()

	// A path that does not match is untouched.
	in.Inject(Fault{Ops: OpWrite | OpSync, Path: "other", Err: syscall.EIO})
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatalf("unmatched path: %v", err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatalf("unmatched path: %v", err)
	}
	in.Reset()

	// Partial: half of a buffered write lands, then the error.
	in.Inject(Fault{Ops: OpWrite, Err: syscall.ENOSPC, Partial: true, Times: 1})
	if n, err := f.WriteAt(bytes.Repeat([]byte{0xaa}, 64), 100); !errors.Is(err, syscall.ENOSPC) || n != 32 {
		t.Fatalf("partial write = %d, %v; want 32, ENOSPC", n, err)
	}
	back := make([]byte, 64)
	if _, err := f.ReadAt(back, 100); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back[:32], bytes.Repeat([]byte{0xaa}, 32)) || !bytes.Equal(back[32:], make([]byte, 32)) {
		t.Fatalf("after a partial write the file holds %x", back)
	}

	// Corrupt: the read succeeds with exactly one byte changed.
	in.Inject(Fault{Ops: OpRead, Corrupt: true, Times: 1})
	got := make([]byte, 64)
	if _, err := f.ReadAt(got, 100); err != nil {
		t.Fatal(err)
	}
	diff := 0
	for i := range got {
		if got[i] != back[i] {
			diff++
		}
	}
	if diff != 1 {
		t.Fatalf("corrupt read changed %d bytes, want 1", diff)
	}

	// Every file-system call of a class fails while its fault is installed.
	in.Inject(Fault{Ops: OpMeta | OpOpen | OpSync, Err: syscall.EIO})
	if err := in.MkdirAll(filepath.Join(dir, "d"), 0o700); !errors.Is(err, syscall.EIO) {
		t.Fatalf("MkdirAll = %v", err)
	}
	if _, err := in.OpenFile(path, os.O_RDONLY, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("OpenFile = %v", err)
	}
	if err := in.SyncDir(dir); !errors.Is(err, syscall.EIO) {
		t.Fatalf("SyncDir = %v", err)
	}
	if _, err := in.Lock(filepath.Join(dir, "lock")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Lock = %v", err)
	}
}

// On an O_DIRECT file a partial write lands whole blocks only, as the device would.
func TestInjectorPartialDirect(t *testing.T) {
	in := NewInjector(Default)
	f, err := in.OpenDirect(filepath.Join(t.TempDir(), "direct"), true)
	if errors.Is(err, syscall.EINVAL) {
		t.Skipf("O_DIRECT unsupported on this file system: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Allocate(1 << 20); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(t, 5*store.BlockSize)
	for i := range buf {
		buf[i] = 0x5a
	}
	in.Inject(Fault{Ops: OpWrite, Err: syscall.EIO, Partial: true, Times: 1})
	if n, err := f.WriteAt(buf, 0); !errors.Is(err, syscall.EIO) || n != 2*store.BlockSize {
		t.Fatalf("partial direct write = %d, %v; want %d, EIO", n, err, 2*store.BlockSize)
	}
	got := alignedBuf(t, 5*store.BlockSize)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:2*store.BlockSize], buf[:2*store.BlockSize]) || !bytes.Equal(got[2*store.BlockSize:], make([]byte, 3*store.BlockSize)) {
		t.Fatal("a partial direct write did not land exactly two blocks")
	}
}
