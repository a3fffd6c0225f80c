//go:build linux

package slab

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// fakeClock is a settable time source for forcing lease expiry.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) now() time.Time               { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration)      { c.ns.Add(int64(d)) }
func (c *fakeClock) install(e *Engine) *fakeClock { e.Leases().SetClock(c.now); return c }

// storm writes n fresh values of size bytes (several times the capacity), forcing eviction
// through both the global CLOCK and extent reclaim.
func storm(t *testing.T, e *Engine, from, n, size int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
}

func TestLeaseSurvivesEvictionStorm(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	newFakeClock().install(e)
	const size = 64 * kib
	leased := []int{1, 2, 3}
	for _, i := range append(leased, 4, 5, 6) {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	for _, i := range leased {
		n, ok, err := e.Lease(testKey(i), 10*time.Second)
		if err != nil || !ok || n != size {
			t.Fatalf("lease %d: n=%d ok=%v err=%v", i, n, ok, err)
		}
	}
	// Same-size and other-size storms: the CLOCK and the extent stealing must both skip
	// the leased slots.
	storm(t, e, 100, int(4*e.cfg.CapacityBytes/size), size)
	storm(t, e, 1000, int(2*e.cfg.CapacityBytes/(200*kib)), 200*kib)
	if e.Stats().Evictions == 0 {
		t.Fatal("the storm evicted nothing")
	}
	for _, i := range leased {
		mustGet(t, e, testKey(i), testValue(i, size)) // the read consumes the lease
	}
	unleasedGone := 0
	for _, i := range []int{4, 5, 6} {
		if _, err := get(e, testKey(i)); errors.Is(err, store.ErrNotFound) {
			unleasedGone++
		}
	}
	if unleasedGone == 0 {
		t.Fatal("unleased values all survived: the storm did not exercise eviction")
	}
	if st := e.LeaseStats(); st.Active != 0 || st.Released != 3 {
		t.Fatalf("after reads: %+v", st)
	}
	// Read, the values are ordinary again: the next storm may evict them.
	storm(t, e, 5000, int(4*e.cfg.CapacityBytes/size), size)
	for _, i := range leased {
		if _, err := get(e, testKey(i)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("key %d survived a storm after its lease was consumed: %v", i, err)
		}
	}
}

func TestLeaseCap(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.LeaseShare = 0.25 // 2 MiB of 8 MiB
	e := mustOpen(t, cfg)
	const size = 256 * kib
	var slotSize int64
	for _, c := range SizeClasses(cfg.MaxValueBytes) {
		if c >= size {
			slotSize = c
			break
		}
	}
	want := int(2 * mib / slotSize) // leases are charged by the capacity they hold
	for i := range 12 {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	granted := 0
	for i := range 12 {
		n, ok, err := e.Lease(testKey(i), time.Minute)
		if err != nil || n != size {
			t.Fatalf("lookup %d past the cap must still answer: n=%d err=%v", i, n, err)
		}
		if ok {
			granted++
		}
	}
	if granted != want || want < 4 {
		t.Fatalf("granted %d leases of %d-byte slots under a 2 MiB cap, want %d", granted, slotSize, want)
	}
	st := e.LeaseStats()
	if st.Refused != int64(12-want) || st.ActiveBytes != int64(want)*slotSize || st.LimitBytes != 2*mib {
		t.Fatalf("stats %+v", st)
	}
	// Re-leasing a held key extends it without a second charge.
	if _, ok, _ := e.Lease(testKey(0), time.Minute); !ok {
		t.Fatal("extending a held lease was refused")
	}
	// A read frees budget for a new lease.
	mustGet(t, e, testKey(0), testValue(0, size))
	if _, ok, _ := e.Lease(testKey(11), time.Minute); !ok {
		t.Fatal("lease refused after a read freed budget")
	}
	if _, _, err := e.Lease(testKey(999), time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("lease of an absent key: %v", err)
	}
	// Eviction still makes room with the whole lease budget held.
	storm(t, e, 100, int(3*cfg.CapacityBytes/size), size)
}

func TestLeaseExpiryFreesForEviction(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	clk := newFakeClock().install(e)
	const size = 64 * kib
	k := testKey(7)
	mustPut(t, e, k, testValue(7, size))
	if _, ok, err := e.Lease(k, 10*time.Second); !ok || err != nil {
		t.Fatalf("lease: ok=%v err=%v", ok, err)
	}
	storm(t, e, 100, int(2*e.cfg.CapacityBytes/size), size)
	mustStat := func() error { _, err := e.Stat(k); return err }
	if err := mustStat(); err != nil {
		t.Fatalf("leased value evicted before expiry: %v", err)
	}
	clk.advance(11 * time.Second)
	storm(t, e, 1000, int(3*e.cfg.CapacityBytes/size), size)
	if err := mustStat(); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("expired lease still protects the value: %v", err)
	}
	if st := e.LeaseStats(); st.Expired != 1 || st.Active != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLeaseEndsOnRemoveAndReplace(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	const size = 64 * kib
	mustPut(t, e, testKey(1), testValue(1, size))
	mustPut(t, e, testKey(2), testValue(2, size))
	for _, i := range []int{1, 2} {
		if _, ok, _ := e.Lease(testKey(i), time.Minute); !ok {
			t.Fatal("lease refused")
		}
	}
	if err := e.Remove(testKey(1)); err != nil {
		t.Fatal(err)
	}
	mustPut(t, e, testKey(2), testValue(3, size))
	if st := e.LeaseStats(); st.Active != 0 || st.ActiveBytes != 0 {
		t.Fatalf("leases outlived their values: %+v", st)
	}
	for i := range e.extents {
		if n := e.extents[i].leases.Load(); n != 0 {
			t.Fatalf("extent %d still counts %d leases", i, n)
		}
	}
}
