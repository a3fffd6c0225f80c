//go:build linux

package file

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testConfig(dir string) Config {
	return Config{Dir: dir, CapacityBytes: 1 << 20, MaxValueBytes: 256 << 10, Logger: quiet}
}

func mustOpen(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func key(i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i) * 0x9e3779b97f4a7c15, Lo: uint64(i) + 1}, Tenant: 5}
}

func value(i, size int) []byte {
	v := make([]byte, size)
	for j := range v {
		v[j] = byte(i*131 + j*7 + j>>8)
	}
	return v
}

func put(e store.Engine, k store.Key, v []byte) error {
	return e.Put(k, len(v), func(dst []byte) error { copy(dst, v); return nil })
}

func get(e store.Engine, k store.Key) ([]byte, error) {
	var out []byte
	err := e.Get(k, func(v []byte) error { out = bytes.Clone(v); return nil })
	return out, err
}

func check(t *testing.T, e store.Engine, k store.Key, want []byte) {
	t.Helper()
	got, err := get(e, k)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get: %d bytes differ from the %d stored", len(got), len(want))
	}
}

func TestRoundTripAndReopen(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	sizes := []int{1, 4095, 4096, 4097, 65536, 256 << 10}
	for i, s := range sizes {
		if err := put(e, key(i), value(i, s)); err != nil {
			t.Fatal(err)
		}
		check(t, e, key(i), value(i, s))
		if n, err := e.Stat(key(i)); err != nil || n != int64(s) {
			t.Fatalf("Stat = %d, %v", n, err)
		}
	}
	if err := put(e, key(0), value(99, 300)); err != nil { // overwrite
		t.Fatal(err)
	}
	if err := e.Remove(key(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second Remove = %v", err)
	}
	if _, err := get(e, key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Remove = %v", err)
	}
	// A leftover temp file from a crashed write must not matter.
	os.WriteFile(filepath.Join(cfg.Dir, tmpDir, "put-123"), []byte("junk"), 0o600)
	before := e.Stats()
	e.Close()
	e = mustOpen(t, cfg)
	check(t, e, key(0), value(99, 300))
	for i := 2; i < len(sizes); i++ {
		check(t, e, key(i), value(i, sizes[i]))
	}
	if _, err := get(e, key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removed key back after reopen: %v", err)
	}
	if s := e.Stats(); s.Objects != before.Objects || s.UsedBytes != before.UsedBytes {
		t.Fatalf("reopen: %+v vs %+v", s, before)
	}
	if left, _ := os.ReadDir(filepath.Join(cfg.Dir, tmpDir)); len(left) != 0 {
		t.Fatal("temp files not cleaned")
	}
}

func TestRejects(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	for _, tc := range []struct {
		size int
		want error
	}{{0, store.ErrInvalid}, {-5, store.ErrInvalid}, {256<<10 + 1, store.ErrTooLarge}} {
		if err := e.Put(key(1), tc.size, func([]byte) error { return nil }); !errors.Is(err, tc.want) {
			t.Fatalf("Put(%d) = %v, want %v", tc.size, err, tc.want)
		}
	}
	for _, cfg := range []Config{{Dir: "", CapacityBytes: 1}, {Dir: "/x", CapacityBytes: 0}, {Dir: "/x", CapacityBytes: 10, MaxValueBytes: 11}} {
		if err := cfg.Validate(); err == nil {
			t.Fatalf("Validate(%+v) accepted", cfg)
		}
	}
}

func TestCorruptValue(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	for _, tc := range []struct {
		name string
		off  int64
	}{{"payload", headerSize + 100}, {"header", 10}} {
		t.Run(tc.name, func(t *testing.T) {
			k := key(len(tc.name))
			if err := put(e, k, value(1, 5000)); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(e.path(k), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte{0xee}, tc.off)
			f.Close()
			before := e.Stats().CorruptReads
			called := false
			err = e.Get(k, func([]byte) error { called = true; return nil })
			if called || !errors.Is(err, store.ErrNotFound) || !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("Get = %v (fn called %v), want NotFound+Corrupt", err, called)
			}
			if n := e.Stats().CorruptReads - before; n != 1 {
				t.Fatalf("CorruptReads grew by %d", n)
			}
			if _, err := os.Stat(e.path(k)); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("corrupt file kept")
			}
		})
	}
}

func TestEviction(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 64 << 10
	n := int(3 * cfg.CapacityBytes / size)
	for i := range n {
		if err := put(e, key(i), value(i, size)); err != nil {
			t.Fatal(err)
		}
		if s := e.Stats(); s.UsedBytes > s.CapacityBytes {
			t.Fatalf("used %d > capacity", s.UsedBytes)
		}
	}
	s := e.Stats()
	if s.Evictions == 0 || s.Objects != cfg.CapacityBytes/size {
		t.Fatalf("evictions=%d objects=%d", s.Evictions, s.Objects)
	}
	check(t, e, key(n-1), value(n-1, size))
	if _, err := get(e, key(0)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("oldest value not evicted: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 40 {
				k := (w + j) % 10
				switch j % 3 {
				case 0:
					if err := put(e, key(k), value(k, 10000+k)); err != nil {
						t.Error(err)
					}
				case 1:
					if v, err := get(e, key(k)); err == nil && !bytes.Equal(v, value(k, 10000+k)) {
						t.Error("wrong bytes")
					} else if err != nil && !errors.Is(err, store.ErrNotFound) {
						t.Error(err)
					}
				case 2:
					if err := e.Remove(key(k)); err != nil && !errors.Is(err, store.ErrNotFound) {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	s := e.Stats()
	n := 0
	filepath.WalkDir(filepath.Join(e.cfg.Dir, objectsDir), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	if int64(n) != s.Objects {
		t.Fatalf("%d files on disk, %d objects indexed", n, s.Objects)
	}
	if s.UsedBytes < 0 || s.UsedBytes > s.CapacityBytes {
		t.Fatal(fmt.Sprint(s))
	}
}
