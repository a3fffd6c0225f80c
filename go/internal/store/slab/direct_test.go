//go:build linux

package slab

import (
	"bytes"
	"errors"
	"sync"
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

func TestReadIntoAndPutFrom(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	buf := alignedBuf(t, 1*mib)
	for i, n := range []int{1, 4095, 4096, 5000, 1 * mib} {
		v := testValue(i, n)
		copy(buf, v)
		if err := e.PutFrom(testKey(i), buf, n); err != nil {
			t.Fatalf("PutFrom %d: %v", n, err)
		}
		clear(buf)
		got, err := e.ReadInto(testKey(i), buf)
		if err != nil || got != n || !bytes.Equal(buf[:n], v) {
			t.Fatalf("ReadInto %d: n=%d err=%v", n, got, err)
		}
		var viaGet []byte
		if err := e.Get(testKey(i), func(b []byte) error { viaGet = bytes.Clone(b); return nil }); err != nil || !bytes.Equal(viaGet, v) {
			t.Fatalf("Get after PutFrom %d: %v", n, err)
		}
	}
	if n, err := e.ReadInto(testKey(4), buf[:512*kib]); !errors.Is(err, store.ErrBufferTooSmall) || n != 1*mib {
		t.Fatalf("short buffer: n=%d err=%v", n, err)
	}
	if _, err := e.ReadInto(testKey(0), buf[1:]); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("unaligned buffer: %v", err)
	}
	if err := e.PutFrom(testKey(9), buf[1:], 10); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("unaligned source: %v", err)
	}
	if _, err := e.ReadInto(testKey(99), buf); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
}

// Every value that leaves the engine is reported exactly once, with its length, so that
// accounting layered above never drifts.
func TestRemovalObserverBalances(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	var mu sync.Mutex
	charged := map[store.Key]int64{}
	why := map[store.RemovalReason]int{}
	e.SetRemovalObserver(func(k store.Key, n int64, r store.RemovalReason) {
		mu.Lock()
		charged[k] -= n
		why[r]++
		mu.Unlock()
	})
	charge := func(k store.Key, n int) {
		mu.Lock()
		charged[k] += int64(n)
		mu.Unlock()
	}
	for i := 0; i < 200; i++ { // 200 × ~100 KiB through 8 MiB: evictions and overwrites
		k := testKey(i % 150)
		if i%5 == 0 {
			k = testKey(i/5%3 + 1000)
		}
		n := 60*kib + (i%7)*10*kib
		mustPut(t, e, k, testValue(i, n))
		charge(k, n)
	}
	for i := 1; i < 150; i += 10 {
		if err := e.Remove(testKey(i)); err == nil {
			continue
		}
	}
	var total, stored int64
	for _, v := range charged {
		total += v
	}
	e.ForEach(func(_ store.Key, n int64) bool { stored += n; return true })
	if total != stored {
		t.Fatalf("charged-minus-released %d != stored %d (reasons %v)", total, stored, why)
	}
	if why[store.Evicted] == 0 || why[store.Replaced] == 0 || why[store.Removed] == 0 {
		t.Fatalf("reasons %v", why)
	}
}
