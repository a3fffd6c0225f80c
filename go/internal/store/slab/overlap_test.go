//go:build linux

package slab

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// gateFS holds payload writes (extent files) at a gate while armed, so that a test can
// copy the directory at the moment a Put's record is durable but its payload is not (or is
// torn): the state a crash at that instant leaves.
type gateFS struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	target  string              // the held write is to a file whose path contains this
	match   func(p []byte) bool // and, if set, carries bytes this accepts
	torn    bool                // land the first half of the held write before holding it
	entered chan gateHold       // one held write at a time
	release chan struct{}
}

type gateHold struct {
	file string
	off  int64
}

func newGateFS() *gateFS {
	return &gateFS{FS: vfs.Default, entered: make(chan gateHold, 1), release: make(chan struct{})}
}

func (g *gateFS) arm(target string, torn bool) {
	g.mu.Lock()
	g.armed, g.target, g.torn = true, target, torn
	g.mu.Unlock()
}

func (g *gateFS) OpenFile(path string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.FS.OpenFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, g: g}, nil
}

func (g *gateFS) OpenDirect(path string, create bool) (vfs.File, error) {
	f, err := g.FS.OpenDirect(path, create)
	if err != nil {
		return nil, err
	}
	return &gateFile{File: f, g: g}, nil
}

type gateFile struct {
	vfs.File
	g *gateFS
}

func (f *gateFile) WriteAt(p []byte, off int64) (int, error) {
	g := f.g
	g.mu.Lock()
	armed, torn := g.armed && strings.Contains(f.Name(), g.target) && (g.match == nil || g.match(p)), g.torn
	if armed {
		g.armed = false // one write per arming
	}
	g.mu.Unlock()
	if !armed {
		return f.File.WriteAt(p, off)
	}
	if torn {
		half := len(p) / 2 / blockSize * blockSize
		if _, err := f.File.WriteAt(p[:half], off); err != nil {
			return 0, err
		}
	}
	g.entered <- gateHold{file: f.Name(), off: off}
	<-g.release
	return f.File.WriteAt(p, off)
}

// snapshot copies an engine directory as it is on disk now (extents are written with
// O_DIRECT, so a buffered read sees the device's bytes).
func snapshot(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	copyTree(t, src, dst, func(string) bool { return true })
	return dst
}

// copyTree copies the files of src whose path (relative to src) keep accepts into dst.
func copyTree(t *testing.T, src, dst string, keep func(rel string) bool) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if !fi.IsDir() && !keep(rel) {
			return nil
		}
		to := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRecordDurableBeforePayload covers the crash window the overlapped payload write and
// table commit open: a Put's record is durable while its slot still holds a torn payload or
// the bytes of the slot's previous tenant (another key's value, or an older version of the
// same key). After a "crash" at that instant (a copy of the directory), the key must read
// as a miss detected by the payload CRC: never wrong bytes, never the key's older version.
// The held Put itself must then complete and read back its value.
func TestRecordDurableBeforePayload(t *testing.T) {
	const size = 20000
	other := testKey(500)
	tests := []struct {
		name string
		torn bool
		// prepare stores what the slot and the key held before; it returns the offset of
		// the slot the held Put must land in (-1: any) and the key's older values.
		prepare func(t *testing.T, e *Engine, k store.Key) (slotOff int64, older [][]byte)
	}{
		{name: "fresh key, slot of a removed value", prepare: func(t *testing.T, e *Engine, k store.Key) (int64, [][]byte) {
			mustPut(t, e, other, testValue(500, size))
			_, off, _, _ := e.slotOf(other)
			if err := e.Remove(other); err != nil {
				t.Fatal(err)
			}
			return off, nil
		}},
		{name: "overwrite, torn payload", torn: true, prepare: func(t *testing.T, e *Engine, k store.Key) (int64, [][]byte) {
			v1 := testValue(1, size)
			mustPut(t, e, k, v1)
			return -1, [][]byte{v1}
		}},
		{name: "overwrite into the slot of the key's own older version", prepare: func(t *testing.T, e *Engine, k store.Key) (int64, [][]byte) {
			v0, v1 := testValue(10, size), testValue(11, size)
			mustPut(t, e, k, v0)
			_, off, _, _ := e.slotOf(k)
			mustPut(t, e, k, v1) // v0's slot is tombstoned and free again (LIFO free list)
			return off, [][]byte{v0, v1}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateFS()
			cfg := testConfig(t.TempDir())
			cfg.FS = g
			e := mustOpen(t, cfg)
			k := testKey(7)
			for i := range 4 { // bystanders that must survive untouched
				mustPut(t, e, testKey(100+i), testValue(100+i, size))
			}
			wantOff, older := tc.prepare(t, e, k)
			newest := testValue(99, size)

			g.arm(extentsDir, tc.torn)
			done := make(chan error, 1)
			go func() { done <- put(e, k, newest) }()
			hold := <-g.entered
			if !strings.Contains(hold.file, extentsDir) {
				t.Fatalf("held a write to %s, want an extent", hold.file)
			}
			if wantOff >= 0 && hold.off != wantOff {
				t.Fatalf("the Put landed at offset %d, want the previous tenant's slot at %d", hold.off, wantOff)
			}
			// The payload write starts before the record is written: wait for the record.
			waitRecord(t, cfg.Dir, k, newest)
			// Every table write made so far (the held Put's record and tombstones included)
			// is durable now; the payload is not.
			if err := e.commitTable(); err != nil {
				t.Fatal(err)
			}
			crashed := snapshot(t, cfg.Dir)
			close(g.release)
			if err := <-done; err != nil {
				t.Fatalf("held Put: %v", err)
			}
			mustGet(t, e, k, newest)

			c := testConfig(crashed)
			e2 := mustOpen(t, c)
			if !e2.UncleanStart() {
				t.Fatal("the copy was not taken as a crash")
			}
			got, err := get(e2, k)
			switch {
			case err == nil:
				for i, o := range older {
					if bytes.Equal(got, o) {
						t.Fatalf("after the crash the key returns its older version %d", i)
					}
				}
				t.Fatalf("after the crash the key returns %d bytes that were never acknowledged", len(got))
			case !errors.Is(err, store.ErrNotFound) || !errors.Is(err, store.ErrCorrupt):
				// ErrCorrupt proves the durable record was found and its payload rejected
				// by the CRC (a plain miss would mean the window was not reproduced).
				t.Fatalf("after the crash: %v; want a miss detected by the payload CRC", err)
			}
			mustNotFound(t, e2, k) // dropped, and stays a miss
			mustNotFound(t, e2, other)
			for i := range 4 {
				mustGet(t, e2, testKey(100+i), testValue(100+i, size))
			}
			// A restart after the drop keeps the key a miss (the drop's tombstone is durable).
			if err := e2.Close(); err != nil {
				t.Fatal(err)
			}
			e3 := mustOpen(t, c)
			mustNotFound(t, e3, k)
			mustPut(t, e3, k, newest)
			mustGet(t, e3, k, newest)
		})
	}
}

// TestTakenVictimPayloadBeforeRecord covers the other window of a full cache's PUT: the
// Put reuses its CLOCK victim's slot at once (no tombstone commit first), so a crash can
// leave the victim's live record over the new payload, or a torn one. The crash state is
// built from the table as it was when the Put's first table write (the victim's unsynced
// tombstone) was about to happen (held) and the extents after the Put completed. The victim
// must read as a CRC miss, never the new bytes under its key, and the new key (no record)
// as a miss.
func TestTakenVictimPayloadBeforeRecord(t *testing.T) {
	const size = 1 * mib // one slot per 1 MiB extent: 8 values fill the test cache
	g := newGateFS()
	cfg := testConfig(t.TempDir())
	cfg.FS = g
	e := mustOpen(t, cfg)
	offs := map[int]int64{}
	exts := map[int]int{}
	for i := range 8 {
		mustPut(t, e, testKey(i), testValue(i, size))
		exts[i], offs[i], _, _ = e.slotOf(testKey(i))
	}
	syncs := e.tblSync.count()
	k := testKey(100)
	g.arm(tableName, false)
	done := make(chan error, 1)
	go func() { done <- put(e, k, testValue(100, size)) }()
	hold := <-g.entered // the Put's first table write is held; the victim is out of the index
	crashed := t.TempDir()
	copyTree(t, cfg.Dir, crashed, func(rel string) bool { return !strings.HasPrefix(rel, extentsDir) })
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := e.tblSync.count() - syncs; n != 1 {
		t.Fatalf("the evicting Put took %d table commits, want 1 (its own record's)", n)
	}
	victim := -1
	for i := range 8 {
		if _, err := get(e, testKey(i)); errors.Is(err, store.ErrNotFound) {
			victim = i
		}
	}
	ext, off, _, ok := e.slotOf(k)
	if victim < 0 || !ok || ext != exts[victim] || off != offs[victim] {
		t.Fatalf("victim %d: the new value is at extent %d offset %d, want the victim's slot", victim, ext, off)
	}
	if want := (int64(exts[victim])*e.maxSlots + offs[victim]/size) * recordSize; hold.off != want {
		t.Fatalf("the held table write is at %d, want the victim's record at %d", hold.off, want)
	}
	copyTree(t, cfg.Dir, crashed, func(rel string) bool { return strings.HasPrefix(rel, extentsDir) })

	e2 := mustOpen(t, testConfig(crashed))
	got, err := get(e2, testKey(victim))
	if err == nil {
		t.Fatalf("the victim returns %d bytes (new value: %v)", len(got), bytes.Equal(got, testValue(100, size)))
	}
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("victim: %v; want a miss detected by the payload CRC (its record is live in the crash state)", err)
	}
	mustNotFound(t, e2, k)
	for i := range 8 {
		if i != victim {
			mustGet(t, e2, testKey(i), testValue(i, size))
		}
	}
}

// waitRecord waits (at most 10 s) until slots.tbl holds a live record of key for value v.
func waitRecord(t *testing.T, dir string, key store.Key, v []byte) {
	t.Helper()
	crc := crc32.Checksum(v, castagnoli)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, tableName))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+recordSize <= len(b); i += recordSize {
			r, err := decodeRecord(b[i : i+recordSize])
			if err == nil && r.State == stateLive && r.Key == key && r.CRC == crc && int(r.Length) == len(v) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the held Put's record never reached the table")
		}
		time.Sleep(time.Millisecond) // polls for the condition above
	}
}

// TestTakenVictimTombstonedAtOnce: the victim's record is replaced (by an unsynced
// tombstone) as soon as its slot is taken, not only by the taking Put's own record after the
// CRC (milliseconds for a large value), so a crash cannot bring the evicted value back once
// any later commit ran (a later overwrite and Remove of the same key, say). With the Put's
// record write held, a copy of the directory must serve the victim as a plain miss.
func TestTakenVictimTombstonedAtOnce(t *testing.T) {
	const size = 1 * mib
	g := newGateFS()
	cfg := testConfig(t.TempDir())
	cfg.FS = g
	e := mustOpen(t, cfg)
	for i := range 8 {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	k := testKey(100)
	g.mu.Lock()
	g.match = func(p []byte) bool { // the taking Put's own record
		r, err := decodeRecord(p)
		return len(p) == recordSize && err == nil && r.State == stateLive && r.Key == k
	}
	g.mu.Unlock()
	g.arm(tableName, false)
	done := make(chan error, 1)
	go func() { done <- put(e, k, testValue(100, size)) }()
	<-g.entered // the Put's record write is held: its CRC is done, its payload may be written
	victim := -1
	for i := range 8 {
		if _, _, _, ok := e.slotOf(testKey(i)); !ok {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatal("no victim out of the index while the evicting Put's record write is held")
	}
	if err := e.commitTable(); err != nil { // any later commit, e.g. another key's Put
		t.Fatal(err)
	}
	crashed := snapshot(t, cfg.Dir)
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e2 := mustOpen(t, testConfig(crashed))
	if got, err := get(e2, testKey(victim)); err == nil {
		t.Fatalf("the evicted value came back after the crash (%d bytes)", len(got))
	} else if !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("victim: %v; want a plain miss (its record replaced)", err)
	}
	for i := range 8 {
		if i != victim {
			mustGet(t, e2, testKey(i), testValue(i, size))
		}
	}
}
