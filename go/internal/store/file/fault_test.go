//go:build linux

package file

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// TestFaults puts a vfs.Injector under the engine: every disk fault must fail the operation
// (or turn it into a miss), move the I/O-error or corrupt-read counter, never hand wrong
// bytes to the caller, leave the engine serving once the fault clears, and leave a
// directory that a restart on the plain file system reads back consistently.
func TestFaults(t *testing.T) {
	const (
		preloaded = 6
		victim    = 2
		fresh     = 100
	)
	size := func(i int) int { return 1000 + i*9000 }
	putFresh := func(e *Engine) error { return put(e, key(fresh), value(fresh, 40000)) }
	getVictim := func(e *Engine) error {
		return e.Get(key(victim), func(v []byte) error {
			if !bytes.Equal(v, value(victim, size(victim))) {
				return errors.New("wrong bytes reached the caller")
			}
			return nil
		})
	}
	tests := []struct {
		name          string
		fault         vfs.Fault
		op            func(*Engine) error
		want          []error
		counter       string // "io" or "corrupt"
		victimMayMiss bool
	}{
		{"EIO on write", vfs.Fault{Ops: vfs.OpWrite, Path: tmpDir, Err: syscall.EIO}, putFresh, []error{store.ErrIO}, "io", false},
		{"ENOSPC on write", vfs.Fault{Ops: vfs.OpWrite, Path: tmpDir, Err: syscall.ENOSPC}, putFresh, []error{store.ErrCacheFull}, "io", false},
		{"short write", vfs.Fault{Ops: vfs.OpWrite, Path: tmpDir, Err: syscall.EIO, Partial: true}, putFresh, []error{store.ErrIO}, "io", false},
		{"fsync failure", vfs.Fault{Ops: vfs.OpSync, Path: tmpDir, Err: syscall.EIO}, putFresh, []error{store.ErrIO}, "io", false},
		{"rename failure", vfs.Fault{Ops: vfs.OpMeta, Path: objectsDir, Err: syscall.EIO}, putFresh, []error{store.ErrIO}, "io", false},
		{"directory sync failure", vfs.Fault{Ops: vfs.OpSync, Path: objectsDir, Err: syscall.EIO}, putFresh, []error{store.ErrIO}, "io", false},
		{"EIO on read", vfs.Fault{Ops: vfs.OpRead, Path: objectsDir, Err: syscall.EIO}, getVictim, []error{store.ErrIO}, "io", false},
		{"silent corruption on read", vfs.Fault{Ops: vfs.OpRead, Path: objectsDir, Corrupt: true}, getVictim,
			[]error{store.ErrNotFound, store.ErrCorrupt}, "corrupt", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inj := vfs.NewInjector(vfs.Default)
			cfg := testConfig(t.TempDir())
			cfg.FS = inj
			e, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i := range preloaded {
				if err := put(e, key(i), value(i, size(i))); err != nil {
					t.Fatal(err)
				}
			}
			before := e.Stats()
			inj.Inject(tc.fault)
			err = tc.op(e)
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Fatalf("op = %v, want %v", err, tc.want)
				}
			}
			if inj.Injected() == 0 {
				t.Fatal("the fault never fired: the test exercised nothing")
			}
			s := e.Stats()
			if tc.counter == "io" && s.IOErrors <= before.IOErrors {
				t.Fatalf("IOErrors %d -> %d", before.IOErrors, s.IOErrors)
			}
			if tc.counter == "corrupt" && s.CorruptReads <= before.CorruptReads {
				t.Fatalf("CorruptReads %d -> %d", before.CorruptReads, s.CorruptReads)
			}
			inj.Reset()
			if err := put(e, key(fresh+1), value(fresh+1, 3000)); err != nil {
				t.Fatalf("Put after the fault cleared: %v", err)
			}
			consistent := func(e *Engine, when string) {
				t.Helper()
				for i := range preloaded {
					got, err := get(e, key(i))
					if i == victim && tc.victimMayMiss && errors.Is(err, store.ErrNotFound) {
						continue
					}
					if err != nil || !bytes.Equal(got, value(i, size(i))) {
						t.Fatalf("%s: key %d: %d bytes, %v", when, i, len(got), err)
					}
				}
				if got, err := get(e, key(fresh)); err == nil {
					if !bytes.Equal(got, value(fresh, 40000)) {
						t.Fatalf("%s: the failed Put's key returns wrong bytes", when)
					}
				} else if !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s: the failed Put's key: %v", when, err)
				}
				check(t, e, key(fresh+1), value(fresh+1, 3000))
			}
			consistent(e, "after the fault")
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			cfg.FS = nil
			e2 := mustOpen(t, cfg)
			consistent(e2, "after restart")
			if tmps, _ := os.ReadDir(filepath.Join(cfg.Dir, tmpDir)); len(tmps) != 0 {
				t.Fatalf("%d temp files survived the restart", len(tmps))
			}
		})
	}
}
