//go:build linux

package slab

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// TestFaults puts a vfs.Injector under the engine and checks that every disk fault fails
// closed: the operation errors (or misses), the I/O-error or corrupt-read counter moves,
// no caller ever sees wrong bytes, nothing panics, the engine keeps serving once the fault
// clears, and a restart on the plain file system recovers a consistent store.
func TestFaults(t *testing.T) {
	const (
		preloaded = 8
		victim    = 3   // a preloaded key the read faults hit
		fresh     = 100 // the key the write faults hit
	)
	size := func(i int) int { return 3000 + i*7001 } // several size classes
	putFresh := func(e *Engine) error { return put(e, testKey(fresh), testValue(fresh, 50000)) }
	getVictim := func(e *Engine) error {
		return e.Get(testKey(victim), func(v []byte) error {
			if !bytes.Equal(v, testValue(victim, size(victim))) {
				return errors.New("wrong bytes reached the caller")
			}
			return nil
		})
	}
	tests := []struct {
		name  string
		fault vfs.Fault
		op    func(*Engine) error
		want  []error // every one must match the op's error (errors.Is)
		// counter that must move: "io" (IOErrors) or "corrupt" (CorruptReads)
		counter string
		// the victim may be gone afterwards (a detected corruption drops it)
		victimMayMiss bool
		unhealthy     bool // Stats().Healthy must turn false while the fault lasts
		crash         bool // stop without the clean marker before the restart
	}{
		{name: "EIO on payload write", fault: vfs.Fault{Ops: vfs.OpWrite, Path: extentsDir, Err: syscall.EIO},
			op: putFresh, want: []error{store.ErrIO}, counter: "io"},
		{name: "ENOSPC on payload write", fault: vfs.Fault{Ops: vfs.OpWrite, Path: extentsDir, Err: syscall.ENOSPC},
			op: putFresh, want: []error{store.ErrCacheFull}, counter: "io"},
		{name: "short payload write", fault: vfs.Fault{Ops: vfs.OpWrite, Path: extentsDir, Err: syscall.EIO, Partial: true},
			op: putFresh, want: []error{store.ErrIO}, counter: "io", crash: true},
		{name: "EIO on record write", fault: vfs.Fault{Ops: vfs.OpWrite, Path: tableName, Err: syscall.EIO, Times: 1},
			op: putFresh, want: []error{store.ErrIO}, counter: "io"},
		{name: "torn record then crash", fault: vfs.Fault{Ops: vfs.OpWrite, Path: tableName, Err: syscall.EIO, Partial: true},
			op: putFresh, want: []error{store.ErrIO}, counter: "io", crash: true},
		{name: "fdatasync failure", fault: vfs.Fault{Ops: vfs.OpSync, Path: tableName, Err: syscall.EIO},
			op: func(e *Engine) error {
				// Three failing Puts in a row: nothing can be made durable any more.
				for i := range 3 {
					if err := put(e, testKey(fresh+10+i), testValue(i, 9000)); err == nil {
						return fmt.Errorf("put %d succeeded although the table cannot sync", i)
					}
				}
				return putFresh(e)
			},
			want: []error{store.ErrIO}, counter: "io", unhealthy: true, crash: true},
		{name: "EIO on payload read", fault: vfs.Fault{Ops: vfs.OpRead, Path: extentsDir, Err: syscall.EIO},
			op: getVictim, want: []error{store.ErrIO}, counter: "io"},
		{name: "silent corruption on payload read", fault: vfs.Fault{Ops: vfs.OpRead, Path: extentsDir, Corrupt: true},
			op: getVictim, want: []error{store.ErrNotFound, store.ErrCorrupt}, counter: "corrupt", victimMayMiss: true},
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
				mustPut(t, e, testKey(i), testValue(i, size(i)))
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
			switch tc.counter {
			case "io":
				if s.IOErrors <= before.IOErrors {
					t.Fatalf("IOErrors %d -> %d: the fault was not counted", before.IOErrors, s.IOErrors)
				}
			case "corrupt":
				if s.CorruptReads <= before.CorruptReads {
					t.Fatalf("CorruptReads %d -> %d: the corruption was not counted", before.CorruptReads, s.CorruptReads)
				}
			}
			if s.Healthy == tc.unhealthy {
				t.Fatalf("Healthy = %v while the fault lasts, want %v", s.Healthy, !tc.unhealthy)
			}

			inj.Reset()
			// The engine serves again: a new value round-trips, health returns.
			mustPut(t, e, testKey(fresh+1), testValue(fresh+1, 20000))
			mustGet(t, e, testKey(fresh+1), testValue(fresh+1, 20000))
			if !e.Stats().Healthy {
				t.Fatal("still unhealthy after the fault cleared and a Put succeeded")
			}
			check := func(e *Engine, when string) {
				t.Helper()
				for i := range preloaded {
					got, err := get(e, testKey(i))
					if i == victim && tc.victimMayMiss && errors.Is(err, store.ErrNotFound) {
						continue
					}
					if err != nil || !bytes.Equal(got, testValue(i, size(i))) {
						t.Fatalf("%s: key %d: %d bytes, %v; want its value", when, i, len(got), err)
					}
				}
				// The failed write left nothing or the whole value, never something else.
				if got, err := get(e, testKey(fresh)); err == nil {
					if !bytes.Equal(got, testValue(fresh, 50000)) {
						t.Fatalf("%s: the failed Put's key returns wrong bytes", when)
					}
				} else if !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s: the failed Put's key: %v", when, err)
				}
			}
			check(e, "after the fault")

			if tc.crash {
				e.abandon()
			} else if err := e.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			cfg.FS = nil
			e2 := mustOpen(t, cfg)
			check(e2, "after restart")
			mustGet(t, e2, testKey(fresh+1), testValue(fresh+1, 20000))
			mustPut(t, e2, testKey(fresh+2), testValue(fresh+2, 7000))
			mustGet(t, e2, testKey(fresh+2), testValue(fresh+2, 7000))
		})
	}
}

// TestOpenFaults: a fault while opening fails Open with the cause and leaves the directory
// usable by the next Open on a healthy disk.
func TestOpenFaults(t *testing.T) {
	tests := []struct {
		name  string
		fault vfs.Fault
		want  error
		fresh bool // format a new directory (extents are preallocated only when created)
	}{
		{"ENOSPC preallocating an extent", vfs.Fault{Ops: vfs.OpAllocate, Path: extentsDir, Err: syscall.ENOSPC, Skip: 3}, store.ErrCacheFull, true},
		{"EIO reading the record table", vfs.Fault{Ops: vfs.OpRead, Path: tableName, Err: syscall.EIO}, syscall.EIO, false},
		{"EIO syncing the directory", vfs.Fault{Ops: vfs.OpSync, Err: syscall.EIO}, syscall.EIO, false},
		{"EIO opening an extent", vfs.Fault{Ops: vfs.OpOpen, Path: extentsDir, Err: syscall.EIO}, syscall.EIO, false},
		{"EIO reading the superblock", vfs.Fault{Ops: vfs.OpRead, Path: metaName, Err: syscall.EIO}, syscall.EIO, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			n := 4
			if tc.fresh {
				n = 0
			} else {
				e := mustOpen(t, cfg)
				for i := range n {
					mustPut(t, e, testKey(i), testValue(i, 10000+i))
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			inj := vfs.NewInjector(vfs.Default)
			inj.Inject(tc.fault)
			bad := cfg
			bad.FS = inj
			if e, err := Open(bad); err == nil {
				e.Close()
				t.Fatal("Open succeeded through the fault")
			} else if !errors.Is(err, tc.want) {
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			if inj.Injected() == 0 {
				t.Fatal("the fault never fired")
			}
			e := mustOpen(t, cfg)
			for i := range n {
				mustGet(t, e, testKey(i), testValue(i, 10000+i))
			}
			mustPut(t, e, testKey(9), testValue(9, 30000))
			mustGet(t, e, testKey(9), testValue(9, 30000))
		})
	}
}
