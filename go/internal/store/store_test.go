package store_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

func key(i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i), Lo: ^uint64(i)}, Tenant: 1}
}

func put(e store.Engine, k store.Key, v []byte) error {
	return e.Put(k, len(v), func(dst []byte) error { copy(dst, v); return nil })
}

type removal struct {
	key  store.Key
	size int64
	why  store.RemovalReason
}

func TestMemEvictsOldestAndReportsEveryRemoval(t *testing.T) {
	m := store.NewMem(300)
	var got []removal
	if !store.SetRemovalObserver(m, func(k store.Key, n int64, why store.RemovalReason) {
		got = append(got, removal{k, n, why})
	}) {
		t.Fatal("Mem is Observable")
	}
	for i := range 3 {
		if err := put(m, key(i), bytes.Repeat([]byte{byte(i)}, 100)); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth value evicts the oldest (key 0), an overwrite reports Replaced, a Remove
	// reports Removed.
	if err := put(m, key(3), make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := put(m, key(2), make([]byte, 50)); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(key(1)); err != nil {
		t.Fatal(err)
	}
	want := []removal{{key(0), 100, store.Evicted}, {key(2), 100, store.Replaced}, {key(1), 100, store.Removed}}
	if len(got) != len(want) {
		t.Fatalf("removals %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("removal %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if err := m.Get(key(0), func([]byte) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("evicted key: %v", err)
	}
	s := m.Stats()
	if s.Objects != 2 || s.UsedBytes != 150 || s.Evictions != 1 || s.EvictedBytes != 100 || s.Writes != 5 || !s.Healthy {
		t.Fatalf("stats %+v", s)
	}
	if n, err := m.Stat(key(2)); err != nil || n != 50 {
		t.Fatalf("Stat = %d, %v", n, err)
	}
	if err := m.Remove(key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second Remove = %v", err)
	}
}

func TestMemRejectsAndCloses(t *testing.T) {
	m := store.NewMem(100)
	if err := put(m, key(1), nil); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("empty value: %v", err)
	}
	if err := put(m, key(1), make([]byte, 101)); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("value above capacity: %v", err)
	}
	fillErr := errors.New("socket died")
	if err := m.Put(key(1), 10, func([]byte) error { return fillErr }); err != fillErr {
		t.Fatalf("fill error = %v, want it unwrapped", err)
	}
	if _, err := m.Stat(key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("a failed fill stored something")
	}
	m.Close()
	if err := put(m, key(2), []byte("x")); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Put after Close = %v", err)
	}
	if err := m.Get(key(2), func([]byte) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close = %v", err)
	}
	if m.Stats().Healthy {
		t.Fatal("closed engine reports healthy")
	}
}

// wrapper hides Mem's extra interfaces except through Unwrap.
type wrapper struct{ store.Engine }

func (w wrapper) Unwrap() store.Engine { return w.Engine }

// plain has no Unwrap and no extras.
type plain struct{ store.Engine }

func TestFindAndFallbacks(t *testing.T) {
	m := store.NewMem(0)
	w := wrapper{wrapper{m}}
	if o, ok := store.Find[store.Observable](w); !ok || o != store.Observable(m) {
		t.Fatal("Find did not reach Mem through two wrappers")
	}
	if _, ok := store.Find[store.Observable](plain{m}); ok {
		t.Fatal("Find went through an engine without Unwrap")
	}
	if store.SetRemovalObserver(plain{m}, func(store.Key, int64, store.RemovalReason) {}) {
		t.Fatal("SetRemovalObserver claims success on an engine without an observer")
	}
	// ReadInto and PutFrom fall back to Get/Put with one copy.
	src := []byte("hello, world")
	if err := store.PutFrom(w, key(1), src, 5); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 8)
	if n, err := store.ReadInto(w, key(1), dst); err != nil || n != 5 || string(dst[:5]) != "hello" {
		t.Fatalf("ReadInto = %d, %v, %q", n, err, dst[:n])
	}
	if n, err := store.ReadInto(w, key(1), dst[:3]); !errors.Is(err, store.ErrBufferTooSmall) || n != 5 {
		t.Fatalf("short buffer: %d, %v", n, err)
	}
}

func TestAlignUpAndStatsAdd(t *testing.T) {
	for _, c := range []struct{ in, want int64 }{{0, 0}, {1, 4096}, {4095, 4096}, {4096, 4096}, {4097, 8192}, {1 << 20, 1 << 20}} {
		if got := store.AlignUp(c.in); got != c.want {
			t.Errorf("AlignUp(%d) = %d, want %d", c.in, got, c.want)
		}
	}
	a := store.Stats{Objects: 1, UsedBytes: 2, CapacityBytes: 3, Evictions: 4, EvictedBytes: 5, CorruptReads: 6,
		ReadBytes: 7, WriteBytes: 8, Reads: 9, Writes: 10, IOErrors: 11}
	b := a
	b.Add(a)
	want := store.Stats{Objects: 2, UsedBytes: 4, CapacityBytes: 6, Evictions: 8, EvictedBytes: 10, CorruptReads: 12,
		ReadBytes: 14, WriteBytes: 16, Reads: 18, Writes: 20, IOErrors: 22}
	if b != want {
		t.Fatalf("Add = %+v, want %+v", b, want)
	}
	names := map[string]bool{}
	for _, r := range []store.RemovalReason{store.Removed, store.Replaced, store.Evicted, store.Dropped} {
		names[r.String()] = true
	}
	if len(names) != 4 {
		t.Fatalf("removal reasons do not have distinct names: %v", names)
	}
}
