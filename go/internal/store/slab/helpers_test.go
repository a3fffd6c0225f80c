//go:build linux

package slab

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig is a small geometry: 8 MiB in 1 MiB extents, values up to 1 MiB.
func testConfig(dir string) Config {
	return Config{
		Dir:             dir,
		CapacityBytes:   8 * mib,
		ExtentBytes:     1 * mib,
		MaxValueBytes:   1 * mib,
		BufferPoolBytes: 8 * mib,
		Logger:          quietLogger,
	}
}

func mustOpen(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func testKey(i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i)*0x9e3779b97f4a7c15 + 1, Lo: uint64(i)}, Tenant: 42}
}

// testValue returns deterministic bytes for (i, size).
func testValue(i, size int) []byte {
	v := make([]byte, size)
	x := uint64(i)*0x9e3779b97f4a7c15 ^ uint64(size) | 1
	for j := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v[j] = byte(x)
	}
	return v
}

func put(e store.Engine, k store.Key, v []byte) error {
	return e.Put(k, len(v), func(dst []byte) error {
		if len(dst) != len(v) {
			return fmt.Errorf("fill got %d bytes, want %d", len(dst), len(v))
		}
		copy(dst, v)
		return nil
	})
}

func mustPut(t testing.TB, e store.Engine, k store.Key, v []byte) {
	t.Helper()
	if err := put(e, k, v); err != nil {
		t.Fatalf("Put(%v, %d bytes): %v", k.ID, len(v), err)
	}
}

func get(e store.Engine, k store.Key) ([]byte, error) {
	var out []byte
	err := e.Get(k, func(v []byte) error {
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

func mustGet(t testing.TB, e store.Engine, k store.Key, want []byte) {
	t.Helper()
	got, err := get(e, k)
	if err != nil {
		t.Fatalf("Get(%v): %v", k.ID, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%v): %d bytes differ from the %d stored", k.ID, len(got), len(want))
	}
}

func mustNotFound(t testing.TB, e store.Engine, k store.Key) {
	t.Helper()
	got, err := get(e, k)
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(%v) = %d bytes, %v; want ErrNotFound", k.ID, len(got), err)
	}
}

// abandon drops the engine's descriptors and lock without the clean-stop marker, as a
// crash would.
func (e *Engine) abandon() {
	e.closed.Store(true)
	e.closeFiles()
}

// slotOf returns where a key's value lives (extent file path, byte offset, length).
func (e *Engine) slotOf(k store.Key) (ext int, off int64, length int, ok bool) {
	sh := e.shardOf(k)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	s := sh.m[k]
	if s == nil {
		return 0, 0, 0, false
	}
	return s.ext.idx, int64(s.idx) * s.ext.slotSize, int(s.length), true
}
