//go:build linux

package slab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

func TestEvictionUnderCapacity(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 64 * kib
	n := int(3 * cfg.CapacityBytes / size)
	for i := range n {
		mustPut(t, e, testKey(i), testValue(i, size))
		if s := e.Stats(); s.UsedBytes > s.CapacityBytes {
			t.Fatalf("after put %d: used %d > capacity %d", i, s.UsedBytes, s.CapacityBytes)
		}
		// Recently written values are still there.
		mustGet(t, e, testKey(i), testValue(i, size))
	}
	s := e.Stats()
	if s.Evictions == 0 || s.EvictedBytes < s.Evictions*size {
		t.Fatalf("Evictions=%d EvictedBytes=%d after writing 3x capacity", s.Evictions, s.EvictedBytes)
	}
	if s.UsedBytes > int64(cfg.withDefaults().HighWatermark*float64(cfg.CapacityBytes)) {
		t.Fatalf("used %d above the high watermark", s.UsedBytes)
	}
	hits := 0
	for i := range n {
		v, err := get(e, testKey(i))
		switch {
		case err == nil:
			hits++
			if !bytes.Equal(v, testValue(i, size)) {
				t.Fatalf("key %d: wrong bytes", i)
			}
		case !errors.Is(err, store.ErrNotFound):
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if int64(hits) != s.Objects || hits == 0 {
		t.Fatalf("%d hits, %d objects", hits, s.Objects)
	}
}

func TestSizeMixShift(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	// Fill every extent with small values...
	for i := range int(cfg.CapacityBytes / (16 * kib)) {
		mustPut(t, e, testKey(i), testValue(i, 16*kib))
	}
	// ...then switch to values as large as an extent: extents must be reassigned.
	for i := 1000; i < 1020; i++ {
		mustPut(t, e, testKey(i), testValue(i, 1*mib))
		mustGet(t, e, testKey(i), testValue(i, 1*mib))
	}
	// And back to a middle size.
	for i := 2000; i < 2100; i++ {
		mustPut(t, e, testKey(i), testValue(i, 100*kib))
	}
	mustGet(t, e, testKey(2099), testValue(2099, 100*kib))
	if s := e.Stats(); s.UsedBytes > s.CapacityBytes || s.Evictions == 0 {
		t.Fatalf("used=%d evictions=%d", s.UsedBytes, s.Evictions)
	}
}

// TestPinnedSlotNotReused blocks a Get callback, removes its key and overwrites the
// cache several times: the slot's bytes on disk must stay intact until the callback ends.
func TestPinnedSlotNotReused(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 64 * kib
	k, want := testKey(1), testValue(1, size)
	mustPut(t, e, k, want)
	ext, off, _, _ := e.slotOf(k)

	started, release := make(chan struct{}), make(chan struct{})
	var seen []byte
	done := make(chan error, 1)
	go func() {
		done <- e.Get(k, func(v []byte) error {
			close(started)
			<-release
			seen = bytes.Clone(v) // the buffer must still hold the value after the wait
			return nil
		})
	}()
	<-started
	if err := e.Remove(k); err != nil {
		t.Fatal(err)
	}
	mustNotFound(t, e, k)
	for i := 100; i < 100+int(3*cfg.CapacityBytes/size); i++ {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	raw := make([]byte, size)
	f, err := os.Open(filepath.Join(cfg.Dir, extentsDir, fmt.Sprintf("%06d", ext)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(raw, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, want) {
		t.Fatal("the slot of a pinned value was overwritten while its reader was running")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(seen, want) {
		t.Fatal("callback saw wrong bytes")
	}
	// Once released, the slot is reusable: the engine keeps working at full size.
	for i := 1000; i < 1000+int(cfg.CapacityBytes/size); i++ {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
}

func TestConcurrentOps(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const (
		workers = 8
		ops     = 60
		keys    = 24
	)
	// A value encodes its key and version, so any stored version can be verified.
	value := func(k, ver int) []byte { return testValue(k*1000+ver, 3000+(k*7+ver)%5*9000) }
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ops {
				k := (w*31 + j*7) % keys
				switch j % 4 {
				case 0, 1:
					if err := put(e, testKey(k), value(k, j%3)); err != nil {
						t.Errorf("put: %v", err)
						failures.Add(1)
					}
				case 2:
					v, err := get(e, testKey(k))
					if err == nil {
						ok := false
						for ver := range 3 {
							ok = ok || bytes.Equal(v, value(k, ver))
						}
						if !ok {
							t.Errorf("key %d: bytes of no version", k)
						}
					} else if !errors.Is(err, store.ErrNotFound) {
						t.Errorf("get: %v", err)
					}
				case 3:
					if err := e.Remove(testKey(k)); err != nil && !errors.Is(err, store.ErrNotFound) {
						t.Errorf("remove: %v", err)
					}
				}
				_ = e.Stats()
			}
		}()
	}
	wg.Wait()
	s := e.Stats()
	if s.UsedBytes < 0 || s.UsedBytes > s.CapacityBytes || s.Objects < 0 || s.Objects > keys {
		t.Fatalf("inconsistent stats: %+v", s)
	}
	// The in-memory accounting matches a rebuild from disk.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := mustOpen(t, cfg)
	if s2 := e2.Stats(); s2.Objects != s.Objects || s2.UsedBytes != s.UsedBytes {
		t.Fatalf("after reopen objects %d->%d used %d->%d", s.Objects, s2.Objects, s.UsedBytes, s2.UsedBytes)
	}
}

func TestGroupSyncSharesFsyncs(t *testing.T) {
	var calls atomic.Int64
	g := newGroupSync(func() error {
		calls.Add(1)
		time.Sleep(2 * time.Millisecond) // a slow device: writers pile up behind it
		return nil
	})
	const writers, rounds = 8, 10
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if err := g.commit(); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n >= writers*rounds/2 {
		t.Fatalf("%d fsyncs for %d commits: writers did not share them", n, writers*rounds)
	}
}

func TestGroupSyncError(t *testing.T) {
	fail := errors.New("EIO")
	var bad atomic.Bool
	g := newGroupSync(func() error {
		if bad.Load() {
			return fail
		}
		return nil
	})
	bad.Store(true)
	if err := g.commit(); err != fail {
		t.Fatalf("commit = %v, want the sync error", err)
	}
	bad.Store(false)
	if err := g.commit(); err != nil {
		t.Fatalf("commit after recovery = %v", err)
	}
}

func TestWriteErrorKeepsEngineUsable(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	mustPut(t, e, testKey(1), testValue(1, 5000))
	// Swap every extent descriptor for a read-only one: payload writes fail with EBADF.
	saved := make([]vfs.File, len(e.extents))
	for i, ext := range e.extents {
		f, err := vfs.Default.OpenFile(filepath.Join(cfg.Dir, extentsDir, fmt.Sprintf("%06d", i)), os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		saved[i], ext.f = ext.f, f
	}
	err := put(e, testKey(2), testValue(2, 5000))
	if !errors.Is(err, store.ErrIO) {
		t.Fatalf("Put on a failing device = %v, want ErrIO", err)
	}
	s := e.Stats()
	if s.IOErrors == 0 || !s.Healthy {
		t.Fatalf("IOErrors=%d Healthy=%v", s.IOErrors, s.Healthy)
	}
	mustGet(t, e, testKey(1), testValue(1, 5000)) // reads still work
	for i, ext := range e.extents {
		ext.f = saved[i]
	}
	mustPut(t, e, testKey(2), testValue(2, 5000))
	mustGet(t, e, testKey(2), testValue(2, 5000))
	if s := e.Stats(); s.UsedBytes != 2*8192 {
		t.Fatalf("used=%d after a failed put, want %d", s.UsedBytes, 2*8192)
	}
}

// TestConcurrentSizeMix makes writers of different size classes compete for extents, so
// extents are drained and reassigned while other Puts and Gets are in flight.
func TestConcurrentSizeMix(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.CapacityBytes = 16 * mib
	e := mustOpen(t, cfg)
	sizes := []int{4 * kib, 40 * kib, 300 * kib, 1 * mib}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 40 {
				i := w*1000 + j
				size := sizes[(w+j/10)%len(sizes)] // each writer shifts size every 10 puts
				if err := put(e, testKey(i), testValue(i, size)); err != nil {
					t.Errorf("put %d (%d bytes): %v", i, size, err)
					return
				}
				v, err := get(e, testKey(i-1))
				if err == nil && !bytes.Equal(v, testValue(i-1, len(v))) {
					t.Errorf("key %d: wrong bytes", i-1)
				} else if err != nil && !errors.Is(err, store.ErrNotFound) {
					t.Errorf("get %d: %v", i-1, err)
				}
			}
		}()
	}
	wg.Wait()
	s := e.Stats()
	if s.UsedBytes > s.CapacityBytes || s.CorruptReads != 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := mustOpen(t, cfg)
	if s2 := e2.Stats(); s2.Objects != s.Objects || s2.UsedBytes != s.UsedBytes {
		t.Fatalf("after reopen objects %d->%d used %d->%d", s.Objects, s2.Objects, s.UsedBytes, s2.UsedBytes)
	}
}
