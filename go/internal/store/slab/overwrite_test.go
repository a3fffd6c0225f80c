//go:build linux

package slab

import (
	"bytes"
	"errors"
	"hash/crc32"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

func (g *groupSync) count() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.syncs
}

// TestOverwriteOneSync: the replaced value's tombstone rides in the new record's group
// commit, so an overwrite of an on-disk key costs one table fdatasync, like a fresh Put.
func TestOverwriteOneSync(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	k := testKey(1)
	for ver := range 4 {
		before := e.tblSync.count()
		mustPut(t, e, k, testValue(ver, 7000+ver*60000)) // several classes
		if n := e.tblSync.count() - before; n != 1 {
			t.Fatalf("version %d: %d table syncs, want 1", ver, n)
		}
		mustGet(t, e, k, testValue(ver, 7000+ver*60000))
	}
	if s := e.Stats(); s.Objects != 1 {
		t.Fatalf("objects = %d, want 1", s.Objects)
	}
	// Every replaced slot was released: the old versions' slots are reusable.
	e.allocMu.Lock()
	pending := 0
	for _, c := range e.classes {
		pending += c.pending
	}
	e.allocMu.Unlock()
	if pending != 0 {
		t.Fatalf("%d dead slots still pending after the overwrites", pending)
	}
	// Overwrite, Remove, crash: the Remove must not resurrect an older version.
	mustPut(t, e, testKey(2), testValue(20, 9000))
	mustPut(t, e, testKey(2), testValue(21, 9000))
	if err := e.Remove(testKey(2)); err != nil {
		t.Fatal(err)
	}
	e.abandon()
	e2 := mustOpen(t, cfg)
	mustGet(t, e2, k, testValue(3, 7000+3*60000))
	mustNotFound(t, e2, testKey(2))
}

// TestOverwriteFaults injects table faults into an overwrite (table writes: the old value's
// tombstone first, then the new record, then one fdatasync). The overwrite either succeeds
// or fails; whatever happens, the key then reads as a byte-exact version or a miss, before
// and after a restart, and a failed overwrite never leaves the older version readable
// once its tombstone may be on disk.
func TestOverwriteFaults(t *testing.T) {
	oldV, newV := testValue(1, 20000), testValue(2, 20000)
	tests := []struct {
		name    string
		fault   vfs.Fault
		fails   bool // the overwrite must fail
		crash   bool
		wantNew bool // the key must read as the new version afterwards
	}{
		{name: "EIO on the old value's tombstone", fault: vfs.Fault{Ops: vfs.OpWrite, Path: tableName, Err: syscall.EIO, Times: 1},
			wantNew: true},
		{name: "EIO on the new record", fault: vfs.Fault{Ops: vfs.OpWrite, Path: tableName, Err: syscall.EIO, Skip: 1, Times: 1},
			fails: true},
		{name: "torn new record then crash", fault: vfs.Fault{Ops: vfs.OpWrite, Path: tableName, Err: syscall.EIO, Skip: 1, Times: 1, Partial: true},
			fails: true, crash: true},
		{name: "fdatasync failure then crash", fault: vfs.Fault{Ops: vfs.OpSync, Path: tableName, Err: syscall.EIO, Times: 1},
			fails: true, crash: true},
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
			k := testKey(7)
			mustPut(t, e, k, oldV)
			mustPut(t, e, testKey(8), testValue(8, 5000)) // a bystander
			inj.Inject(tc.fault)
			err = put(e, k, newV)
			if inj.Injected() == 0 {
				t.Fatal("the fault never fired")
			}
			if tc.fails != (err != nil) {
				t.Fatalf("overwrite = %v, want failure %v", err, tc.fails)
			}
			inj.Reset()
			check := func(e *Engine, when string) {
				t.Helper()
				got, err := get(e, k)
				switch {
				case tc.wantNew:
					if err != nil || !bytes.Equal(got, newV) {
						t.Fatalf("%s: %d bytes, %v; want the new version", when, len(got), err)
					}
				case tc.fails && when == "after the fault":
					// The old version's tombstone may be on disk: it must be gone now.
					if !errors.Is(err, store.ErrNotFound) {
						t.Fatalf("%s: %d bytes, %v; want a miss", when, len(got), err)
					}
				case err == nil:
					if !bytes.Equal(got, newV) && !bytes.Equal(got, oldV) {
						t.Fatalf("%s: wrong bytes", when)
					}
				case !errors.Is(err, store.ErrNotFound):
					t.Fatalf("%s: %v", when, err)
				}
				mustGet(t, e, testKey(8), testValue(8, 5000))
			}
			check(e, "after the fault")
			if tc.crash {
				e.abandon()
			} else if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			cfg.FS = nil
			e2 := mustOpen(t, cfg)
			check(e2, "after restart")
			if s := e2.Stats(); s.CorruptReads != 0 {
				t.Fatalf("CorruptReads = %d", s.CorruptReads)
			}
			mustPut(t, e2, k, testValue(3, 9000))
			mustGet(t, e2, k, testValue(3, 9000))
		})
	}
}

// TestPutFromBatch: a batch (new keys, overwrites of durable keys, one invalid item) costs
// one table sync; every valid item is durable and readable, the invalid one is refused
// alone; a table sync failure fails every item of the batch and leaves each key a miss or
// a byte-exact version, before and after a crash.
func TestPutFromBatch(t *testing.T) {
	inj := vfs.NewInjector(vfs.Default)
	cfg := testConfig(t.TempDir())
	cfg.FS = inj
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	size := func(i, ver int) int { return 3000 + i*11000 + ver*100 }
	for i := range 3 { // keys 0..2 exist: the batch overwrites them
		mustPut(t, e, testKey(i), testValue(i, size(i, 0)))
	}
	batch := func(ver int) ([]store.DirectItem, []error) {
		items := make([]store.DirectItem, n+1)
		for i := range n {
			buf := alignedBuf(t, int(alignUp(int64(size(i, ver)))))
			copy(buf, testValue(i*10+ver, size(i, ver)))
			items[i] = store.DirectItem{Key: testKey(i), Src: buf, Size: size(i, ver)}
		}
		items[n] = store.DirectItem{Key: testKey(n), Src: alignedBuf(t, 8192)[1:], Size: 100} // unaligned
		return items, make([]error, n+1)
	}
	items, errs := batch(1)
	before := e.tblSync.count()
	e.PutFromBatch(items, errs)
	if s := e.tblSync.count() - before; s != 1 {
		t.Fatalf("%d table syncs for a batch, want 1", s)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("item %d: %v", i, errs[i])
		}
		mustGet(t, e, testKey(i), testValue(i*10+1, size(i, 1)))
	}
	if !errors.Is(errs[n], store.ErrInvalid) {
		t.Fatalf("unaligned item: %v", errs[n])
	}
	mustNotFound(t, e, testKey(n))

	// The table cannot sync: every item fails; nothing reads wrong.
	inj.Inject(vfs.Fault{Ops: vfs.OpSync, Path: tableName, Err: syscall.EIO, Times: 1})
	items, errs = batch(2)
	e.PutFromBatch(items[:n], errs[:n])
	check := func(e *Engine, when string) {
		t.Helper()
		for i := range n {
			got, err := get(e, testKey(i))
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil || (!bytes.Equal(got, testValue(i*10+1, size(i, 1))) && !bytes.Equal(got, testValue(i*10+2, size(i, 2)))) {
				t.Fatalf("%s: key %d: %d bytes, %v", when, i, len(got), err)
			}
		}
	}
	for i := range n {
		if !errors.Is(errs[i], store.ErrIO) {
			t.Fatalf("item %d under a sync failure: %v", i, errs[i])
		}
	}
	inj.Reset()
	check(e, "after the failed batch")
	e.abandon()
	cfg.FS = nil
	e2 := mustOpen(t, cfg)
	check(e2, "after restart")
	items, errs = batch(3)
	e2.PutFromBatch(items[:n], errs[:n])
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("item %d after restart: %v", i, errs[i])
		}
		mustGet(t, e2, testKey(i), testValue(i*10+3, size(i, 3)))
	}
}

// TestEvictingPutsShareVictimCommits: in a full cache every Put evicts. An unpinned CLOCK
// victim's slot is reused at once by the evicting Put, whose record replaces the victim's
// in its own commit, so 40 evicting Puts cost about 40 table commits (one victim commit
// per Put before its record's was 80; batches of 8 victims per commit, 45). Pinned victims
// are evicted in batches of at most 1/1024 of the capacity: 64 MiB allows 8 slots of 8 KiB.
func TestEvictingPutsShareVictimCommits(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes, cfg.BufferPoolBytes = 64*mib, 8*mib
	e := mustOpen(t, cfg)
	if b := e.reclaimBatch(8 * kib); b != 8 {
		t.Fatalf("reclaimBatch(8 KiB) at 64 MiB = %d, want 8", b)
	}
	if b := mustOpen(t, testConfig(t.TempDir())).reclaimBatch(64 * kib); b != 1 {
		t.Fatalf("reclaimBatch(64 KiB) at 8 MiB = %d, want 1: a small cache evicts one at a time", b)
	}
	const size = 8000
	i := 0
	for ; e.Stats().Evictions == 0; i++ {
		if i > 10000 {
			t.Fatal("no eviction after 10000 Puts")
		}
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	const n = 40
	before, ev := e.tblSync.count(), e.Stats().Evictions
	for j := range n {
		mustPut(t, e, testKey(i+j), testValue(i+j, size))
	}
	syncs := e.tblSync.count() - before
	if evicted := e.Stats().Evictions - ev; evicted < n-8 {
		t.Fatalf("%d evictions for %d Puts into a full cache", evicted, n)
	}
	if max := uint64(n + 2); syncs > max {
		t.Fatalf("%d table syncs for %d evicting Puts, want at most %d", syncs, n, max)
	}
	for j := range n {
		mustGet(t, e, testKey(i+j), testValue(i+j, size))
	}
}

// TestPutFromBatchLargerThanClass: a batch needs more slots of one class than the cache
// has, so later items can only evict values of the same batch: the batch commits what it
// staged and goes on, without waiting out the reclaim timeout and without failing items.
func TestPutFromBatchLargerThanClass(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir())) // 8 MiB in 1 MiB extents: 8 slots of 1 MiB
	const n, size = 12, 1 * mib
	items := make([]store.DirectItem, n)
	for i := range items {
		buf := alignedBuf(t, size)
		copy(buf, testValue(i, size))
		items[i] = store.DirectItem{Key: testKey(i), Src: buf, Size: size}
	}
	errs := make([]error, n)
	start := time.Now()
	e.PutFromBatch(items, errs)
	if d := time.Since(start); d >= reclaimWait {
		t.Fatalf("the batch took %v: it waited for its own reservations", d)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	mustGet(t, e, testKey(n-1), testValue(n-1, size)) // the newest survive
	if s := e.Stats(); s.Objects > 8 || s.Evictions == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A batch item's caller-given CRC32C is what the record stores: a right one reads back
// byte-exact (before and after a restart); a wrong one reads as a miss (ErrCorrupt), never
// as the bytes.
func TestPutFromBatchCallerCRC(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 70000
	item := func(i int, crc uint32) store.DirectItem {
		buf := alignedBuf(t, int(alignUp(size)))
		copy(buf, testValue(i, size))
		return store.DirectItem{Key: testKey(i), Src: buf, Size: size, CRC: crc, HasCRC: true}
	}
	good := crc32.Checksum(testValue(1, size), crc32.MakeTable(crc32.Castagnoli))
	items := []store.DirectItem{item(1, good), item(2, good)} // key 2's CRC is key 1's: wrong
	errs := make([]error, len(items))
	e.PutFromBatch(items, errs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	mustGet(t, e, testKey(1), testValue(1, size))
	if _, err := get(e, testKey(2)); !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a value stored under a wrong CRC read as %v, want a corrupt miss", err)
	}
	e.Close()
	e2 := mustOpen(t, cfg)
	defer e2.Close()
	mustGet(t, e2, testKey(1), testValue(1, size))
}
