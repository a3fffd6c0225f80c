//go:build linux

package vfs

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dfkv/dfkv/go/internal/store"
)

// Op is a class of file-system operations a Fault applies to (a bit set).
type Op uint32

const (
	OpOpen     Op = 1 << iota // OpenDirect, OpenFile, CreateTemp, Lock
	OpRead                    // Read, ReadAt, ReadFile, ReadDir
	OpWrite                   // Write, WriteAt
	OpSync                    // Sync, Datasync, SyncDir
	OpAllocate                // Allocate, PunchHole, Truncate
	OpMeta                    // MkdirAll, Rename, Remove, Stat, File.Stat
)

// Fault describes one injected failure.
type Fault struct {
	Ops  Op     // operations it applies to
	Path string // applies to paths containing this; "" for every path
	Err  error  // the error returned (e.g. syscall.EIO, syscall.ENOSPC)
	// Partial makes a failing write land its first half (rounded down to BlockSize on an
	// O_DIRECT file) before it returns Err: a short or torn write.
	Partial bool
	// Corrupt makes a matching read succeed with one byte flipped instead of failing:
	// silent media corruption, which only a checksum can catch.
	Corrupt bool
	Skip    int // let this many matching calls through first
	Times   int // then fire this many times; 0 fires every time
}

type faultState struct {
	Fault
	seen, fired int
}

// Injector is an FS that passes every call to a base FS unless an installed Fault
// matches it (pebble's errorfs is the model). Safe for concurrent use; faults can be
// added and cleared while the engine runs.
type Injector struct {
	base     FS
	mu       sync.Mutex
	faults   []*faultState
	injected atomic.Int64
}

// NewInjector wraps base.
func NewInjector(base FS) *Injector { return &Injector{base: base} }

// Inject installs a fault.
func (in *Injector) Inject(f Fault) {
	in.mu.Lock()
	in.faults = append(in.faults, &faultState{Fault: f})
	in.mu.Unlock()
}

// Reset removes every fault.
func (in *Injector) Reset() {
	in.mu.Lock()
	in.faults = nil
	in.mu.Unlock()
}

// Injected returns how many calls a fault changed.
func (in *Injector) Injected() int64 { return in.injected.Load() }

// match returns the fault that fires for this call, if any.
func (in *Injector) match(op Op, path string) *Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, f := range in.faults {
		if f.Ops&op == 0 || !strings.Contains(path, f.Path) {
			continue
		}
		f.seen++
		if f.seen <= f.Skip || (f.Times > 0 && f.fired >= f.Times) {
			continue
		}
		f.fired++
		in.injected.Add(1)
		ff := f.Fault
		return &ff
	}
	return nil
}

func (in *Injector) fail(op Op, path string) error {
	if f := in.match(op, path); f != nil && !f.Corrupt {
		return injected(op, path, f.Err)
	}
	return nil
}

func injected(op Op, path string, err error) error {
	return &os.PathError{Op: fmt.Sprintf("injected %s", opName(op)), Path: path, Err: err}
}

func opName(op Op) string {
	switch op {
	case OpOpen:
		return "open"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpAllocate:
		return "allocate"
	default:
		return "meta"
	}
}

func (in *Injector) OpenDirect(path string, create bool) (File, error) {
	if err := in.fail(OpOpen, path); err != nil {
		return nil, err
	}
	f, err := in.base.OpenDirect(path, create)
	if err != nil {
		return nil, err
	}
	return &injFile{File: f, in: in, direct: true}, nil
}

func (in *Injector) OpenFile(path string, flag int, perm os.FileMode) (File, error) {
	if err := in.fail(OpOpen, path); err != nil {
		return nil, err
	}
	f, err := in.base.OpenFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return &injFile{File: f, in: in}, nil
}

func (in *Injector) CreateTemp(dir, pattern string) (File, error) {
	if err := in.fail(OpOpen, dir); err != nil {
		return nil, err
	}
	f, err := in.base.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &injFile{File: f, in: in}, nil
}

func (in *Injector) MkdirAll(path string, perm os.FileMode) error {
	if err := in.fail(OpMeta, path); err != nil {
		return err
	}
	return in.base.MkdirAll(path, perm)
}

func (in *Injector) Rename(oldpath, newpath string) error {
	if err := in.fail(OpMeta, newpath); err != nil {
		return err
	}
	return in.base.Rename(oldpath, newpath)
}

func (in *Injector) Remove(path string) error {
	if err := in.fail(OpMeta, path); err != nil {
		return err
	}
	return in.base.Remove(path)
}

func (in *Injector) Stat(path string) (os.FileInfo, error) {
	if err := in.fail(OpMeta, path); err != nil {
		return nil, err
	}
	return in.base.Stat(path)
}

func (in *Injector) ReadFile(path string) ([]byte, error) {
	f := in.match(OpRead, path)
	if f != nil && !f.Corrupt {
		return nil, injected(OpRead, path, f.Err)
	}
	b, err := in.base.ReadFile(path)
	if err == nil && f != nil && len(b) > 0 {
		b[len(b)/2] ^= 0x20
	}
	return b, err
}

func (in *Injector) ReadDir(path string) ([]os.DirEntry, error) {
	if err := in.fail(OpRead, path); err != nil {
		return nil, err
	}
	return in.base.ReadDir(path)
}

func (in *Injector) SyncDir(dir string) error {
	if err := in.fail(OpSync, dir); err != nil {
		return err
	}
	return in.base.SyncDir(dir)
}

func (in *Injector) Lock(path string) (io.Closer, error) {
	if err := in.fail(OpOpen, path); err != nil {
		return nil, err
	}
	return in.base.Lock(path)
}

type injFile struct {
	File
	in     *Injector
	direct bool
}

func (f *injFile) read(p []byte, do func([]byte) (int, error)) (int, error) {
	ft := f.in.match(OpRead, f.Name())
	if ft != nil && !ft.Corrupt {
		return 0, injected(OpRead, f.Name(), ft.Err)
	}
	n, err := do(p)
	if ft != nil && n > 0 {
		p[n/2] ^= 0x20 // one flipped bit: only a checksum can tell
	}
	return n, err
}

func (f *injFile) Read(p []byte) (int, error) { return f.read(p, f.File.Read) }

func (f *injFile) ReadAt(p []byte, off int64) (int, error) {
	return f.read(p, func(p []byte) (int, error) { return f.File.ReadAt(p, off) })
}

// partial is how many bytes of an n-byte write land before a Partial fault fails it.
func (f *injFile) partial(n int) int {
	h := n / 2
	if f.direct {
		h &^= store.BlockSize - 1
	}
	return h
}

func (f *injFile) Write(p []byte) (int, error) {
	if ft := f.in.match(OpWrite, f.Name()); ft != nil {
		n := 0
		if ft.Partial {
			n, _ = f.File.Write(p[:f.partial(len(p))])
		}
		return n, injected(OpWrite, f.Name(), ft.Err)
	}
	return f.File.Write(p)
}

func (f *injFile) WriteAt(p []byte, off int64) (int, error) {
	if ft := f.in.match(OpWrite, f.Name()); ft != nil {
		n := 0
		if h := f.partial(len(p)); ft.Partial && h > 0 {
			n, _ = f.File.WriteAt(p[:h], off)
		}
		return n, injected(OpWrite, f.Name(), ft.Err)
	}
	return f.File.WriteAt(p, off)
}

func (f *injFile) Sync() error {
	if err := f.in.fail(OpSync, f.Name()); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *injFile) Datasync() error {
	if err := f.in.fail(OpSync, f.Name()); err != nil {
		return err
	}
	return f.File.Datasync()
}

func (f *injFile) Allocate(size int64) error {
	if err := f.in.fail(OpAllocate, f.Name()); err != nil {
		return err
	}
	return f.File.Allocate(size)
}

func (f *injFile) PunchHole(off, size int64) error {
	if err := f.in.fail(OpAllocate, f.Name()); err != nil {
		return err
	}
	return f.File.PunchHole(off, size)
}

func (f *injFile) Truncate(size int64) error {
	if err := f.in.fail(OpAllocate, f.Name()); err != nil {
		return err
	}
	return f.File.Truncate(size)
}

func (f *injFile) Stat() (FileStat, error) {
	if err := f.in.fail(OpMeta, f.Name()); err != nil {
		return FileStat{}, err
	}
	return f.File.Stat()
}
