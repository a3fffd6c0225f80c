//go:build linux

package ramtier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func key(i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i)*0x9e3779b97f4a7c15 + 7, Lo: uint64(i)}, Tenant: 9}
}

// val returns deterministic bytes for (i, size).
func val(i, size int) []byte {
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

func openSlab(t testing.TB) *slab.Engine {
	t.Helper()
	e, err := slab.Open(slab.Config{Dir: t.TempDir(), CapacityBytes: 64 * mib, ExtentBytes: 8 * mib,
		MaxValueBytes: 4 * mib, BufferPoolBytes: 16 * mib, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func newTier(t testing.TB, backing store.Engine, cfg Config) *Tier {
	t.Helper()
	cfg.Logger = quiet
	tr, err := New(backing, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func put(t testing.TB, e store.Engine, k store.Key, v []byte) {
	t.Helper()
	if err := e.Put(k, len(v), func(dst []byte) error { copy(dst, v); return nil }); err != nil {
		t.Fatalf("put: %v", err)
	}
}

func get(t testing.TB, e store.Engine, k store.Key) []byte {
	t.Helper()
	var out []byte
	if err := e.Get(k, func(v []byte) error { out = bytes.Clone(v); return nil }); err != nil {
		t.Fatalf("get: %v", err)
	}
	return out
}

// Warm GETs (after a write-through PUT or after a promotion) touch no disk at all.
func TestWarmGetsDoZeroDiskReads(t *testing.T) {
	for _, pol := range []Policy{WriteThrough, WriteAround} {
		t.Run(pol.String(), func(t *testing.T) {
			sl := openSlab(t)
			tr := newTier(t, sl, Config{ArenaBytes: 32 * mib, Shards: 4, Policy: pol})
			sizes := []int{1, 4095, 4096, 100 * kib, 1 * mib, 1*mib + 3}
			for i, n := range sizes {
				put(t, tr, key(i), val(i, n))
			}
			// One read of each: promotion under write-around, a hit under write-through.
			for i, n := range sizes {
				if got := get(t, tr, key(i)); !bytes.Equal(got, val(i, n)) {
					t.Fatalf("key %d: wrong bytes", i)
				}
			}
			before := sl.Stats()
			wantReads := int64(0)
			if pol == WriteAround {
				wantReads = int64(len(sizes)) // exactly one O_DIRECT read per promotion
			}
			if before.Reads != wantReads {
				t.Fatalf("first reads did %d disk reads, want %d", before.Reads, wantReads)
			}
			for round := 0; round < 5; round++ {
				for i, n := range sizes {
					if got := get(t, tr, key(i)); !bytes.Equal(got, val(i, n)) {
						t.Fatalf("key %d: wrong bytes on a warm read", i)
					}
					if n2, err := tr.Stat(key(i)); err != nil || n2 != int64(n) {
						t.Fatalf("stat %d = %d, %v", i, n2, err)
					}
				}
			}
			after := sl.Stats()
			if after.Reads != before.Reads || after.ReadBytes != before.ReadBytes {
				t.Fatalf("warm GETs read the disk: reads %d -> %d, bytes %d -> %d", before.Reads, after.Reads, before.ReadBytes, after.ReadBytes)
			}
			rs := tr.RAMStats()
			if rs.Hits < int64(5*len(sizes)) || rs.Objects != int64(len(sizes)) {
				t.Fatalf("ram stats %+v", rs)
			}
			if pol == WriteAround && rs.Promoted != int64(len(sizes)) {
				t.Fatalf("promoted %d, want %d", rs.Promoted, len(sizes))
			}
			// Overwrite and remove are seen at once.
			put(t, tr, key(0), val(100, 5000))
			if got := get(t, tr, key(0)); !bytes.Equal(got, val(100, 5000)) {
				t.Fatal("overwrite not visible")
			}
			if err := tr.Remove(key(1)); err != nil {
				t.Fatal(err)
			}
			if err := tr.Get(key(1), func([]byte) error { return nil }); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("get after remove: %v", err)
			}
		})
	}
}

// The disk engine's evictions drop the RAM copy too: RAM never holds what the disk lost.
func TestBackingEvictionDropsRAMCopy(t *testing.T) {
	mem := store.NewMem(256 * kib)
	tr := newTier(t, mem, Config{ArenaBytes: 8 * mib, Shards: 2})
	for i := 0; i < 16; i++ { // 16 × 64 KiB through a 256 KiB disk: the first ones are evicted
		put(t, tr, key(i), val(i, 64*kib))
	}
	for i := 0; i < 16; i++ {
		_, derr := mem.Stat(key(i))
		err := tr.Get(key(i), func(v []byte) error {
			if !bytes.Equal(v, val(i, 64*kib)) {
				t.Errorf("key %d: wrong bytes", i)
			}
			return nil
		})
		if (derr == nil) != (err == nil) {
			t.Fatalf("key %d: disk says %v, tier says %v", i, derr, err)
		}
	}
}

// slowEngine wraps an engine: reads can be gated and are counted.
type slowEngine struct {
	store.Engine
	reads atomic.Int64
	gate  chan struct{} // when not nil, the first read waits for it
	first atomic.Bool
}

func (s *slowEngine) wait() {
	s.reads.Add(1)
	if s.gate != nil && s.first.CompareAndSwap(false, true) {
		<-s.gate
	}
}

func (s *slowEngine) Get(k store.Key, fn func([]byte) error) error {
	s.wait()
	return s.Engine.Get(k, fn)
}

func (s *slowEngine) ReadInto(k store.Key, dst []byte) (int, error) {
	s.wait()
	return store.ReadInto(s.Engine, k, dst)
}

func (s *slowEngine) SetRemovalObserver(fn store.RemovalObserver) {
	store.SetRemovalObserver(s.Engine, fn)
}

// A slot pinned by an in-flight send is never reused: readers block inside the Get
// callback (as a slow socket write would) while writers churn the arena, and every byte a
// reader sees, before and after blocking, is the value of its key.
func TestPinnedSlotsAreNeverReused(t *testing.T) {
	tr := newTier(t, store.NewMem(64*mib), Config{ArenaBytes: 1 * mib, Shards: 1, WaitTimeout: 20 * time.Millisecond})
	const size = 48 * kib
	var next atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad atomic.Int64
	for w := 0; w < 3; w++ { // writers: each PUT is a new key, so the ring keeps turning
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1))
				put(t, tr, key(i), val(i, size))
			}
		}()
	}
	var served atomic.Int64
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				// Recent keys are warm; older ones are promoted from the disk again.
				i := int(next.Load()) - n%40
				if i <= 0 {
					continue
				}
				want := val(i, size)
				err := tr.Get(key(i), func(v []byte) error {
					if !bytes.Equal(v, want) {
						bad.Add(1)
					}
					time.Sleep(2 * time.Millisecond) // a slow socket: the slot stays pinned
					if !bytes.Equal(v, want) {
						bad.Add(1)
					}
					served.Add(1)
					return nil
				})
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					t.Error(err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && (served.Load() < 200 || tr.RAMStats().Evictions < 200) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	rs := tr.RAMStats()
	t.Logf("served %d pinned reads, %d puts, ram %+v", served.Load(), next.Load(), rs)
	if bad.Load() > 0 {
		t.Fatalf("%d reads saw bytes of another value: a pinned slot was reused", bad.Load())
	}
	if rs.Evictions == 0 || served.Load() == 0 {
		t.Fatal("the test did not exercise eviction under pinned reads")
	}
	if rs.Pinned != 0 || rs.Backlog != 0 {
		t.Fatalf("pins or backlog leaked: %+v", rs)
	}
}

// Concurrent cold readers of one key share a single disk read, straight into the arena.
func TestCoalescedReadersDoOneDiskRead(t *testing.T) {
	sl := openSlab(t)
	gated := &slowEngine{Engine: sl, gate: make(chan struct{})}
	tr := newTier(t, gated, Config{ArenaBytes: 16 * mib, Shards: 2, Policy: WriteAround,
		Coalesce: true, CoalesceTimeout: 30 * time.Second})
	want := val(1, 1*mib)
	put(t, tr, key(1), want)
	const readers = 16
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- tr.Get(key(1), func(v []byte) error {
				if !bytes.Equal(v, want) {
					return errors.New("wrong bytes")
				}
				return nil
			})
		}()
	}
	for tr.flights.Waiting() < readers-1 { // every follower joined the leader's flight
		time.Sleep(time.Millisecond)
	}
	close(gated.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := gated.reads.Load(); n != 1 {
		t.Fatalf("%d backing reads for %d concurrent readers, want 1", n, readers)
	}
	if s := sl.Stats(); s.Reads != 1 {
		t.Fatalf("%d device reads, want 1", s.Reads)
	}
	cs := tr.CoalesceStats()
	if cs.Leaders != 1 || cs.Coalesced != readers-1 || cs.Timeouts != 0 {
		t.Fatalf("coalesce stats %+v", cs)
	}
	if rs := tr.RAMStats(); rs.Pinned != 0 || rs.Promoted != 1 {
		t.Fatalf("ram stats %+v", rs)
	}
}

// A follower whose leader stalls reads on its own after the timeout instead of hanging.
func TestStalledLeaderDoesNotHangFollowers(t *testing.T) {
	gated := &slowEngine{Engine: store.NewMem(0), gate: make(chan struct{})}
	const timeout = 100 * time.Millisecond
	tr := newTier(t, gated, Config{ArenaBytes: 8 * mib, Shards: 2, Policy: WriteAround, Coalesce: true, CoalesceTimeout: timeout})
	want := val(2, 64*kib)
	put(t, tr, key(2), want)
	leaderDone := make(chan error, 1)
	go func() {
		leaderDone <- tr.Get(key(2), func(v []byte) error {
			if !bytes.Equal(v, want) {
				return errors.New("leader: wrong bytes")
			}
			return nil
		})
	}()
	for gated.reads.Load() == 0 { // the leader is stuck in its disk read
		time.Sleep(time.Millisecond)
	}
	const followers = 4
	var wg sync.WaitGroup
	start := time.Now()
	for f := 0; f < followers; f++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := tr.Get(key(2), func(v []byte) error {
				if !bytes.Equal(v, want) {
					return errors.New("follower: wrong bytes")
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout + 10*time.Second): // generous slack for -race on 2 cores
		t.Fatal("followers hung behind a stalled leader")
	}
	t.Logf("followers finished after %v (timeout %v)", time.Since(start), timeout)
	if cs := tr.CoalesceStats(); cs.Timeouts == 0 {
		t.Fatalf("no follower timed out: %+v", cs)
	}
	close(gated.gate)
	if err := <-leaderDone; err != nil {
		t.Fatal(err)
	}
}

// Concurrent writers, removers and readers of a few keys: a reader only ever sees one of
// the values written for its key, and RAM ends consistent with the disk.
func TestConcurrentWritesStayConsistent(t *testing.T) {
	mem := store.NewMem(0)
	tr := newTier(t, mem, Config{ArenaBytes: 4 * mib, Shards: 2, Coalesce: true})
	const keys, versions = 4, 50
	valid := func(k int, v []byte) bool {
		if len(v) < 8 {
			return false
		}
		ver := int(v[0]) | int(v[1])<<8
		return ver < versions && bytes.Equal(v, versionVal(k, ver))
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for ver := 0; ver < versions; ver++ {
				k := (w + ver) % keys
				if ver%7 == 3 {
					_ = tr.Remove(key(k))
					continue
				}
				put(t, tr, key(k), versionVal(k, ver))
			}
		}(w)
	}
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				k := (r + i) % keys
				err := tr.Get(key(k), func(v []byte) error {
					if !valid(k, v) {
						return fmt.Errorf("key %d: bytes of no version", k)
					}
					return nil
				})
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					t.Error(err)
					return
				}
			}
		}(r)
	}
	wg.Wait()
	for k := 0; k < keys; k++ {
		var disk []byte
		derr := mem.Get(key(k), func(v []byte) error { disk = bytes.Clone(v); return nil })
		var ram []byte
		rerr := tr.Get(key(k), func(v []byte) error { ram = bytes.Clone(v); return nil })
		if (derr == nil) != (rerr == nil) || !bytes.Equal(disk, ram) {
			t.Fatalf("key %d: tier (%v) disagrees with disk (%v)", k, rerr, derr)
		}
	}
}

func versionVal(k, ver int) []byte {
	v := val(k*1000+ver, 8*kib+ver)
	v[0], v[1] = byte(ver), byte(ver>>8)
	return v
}

func TestConfigAndPolicy(t *testing.T) {
	if _, err := New(store.NewMem(0), Config{ArenaBytes: 1 * mib, Shards: 8}); err == nil {
		t.Fatal("a 128 KiB shard was accepted")
	}
	for _, s := range []string{"write-through", "write-around", "write-back"} {
		p, err := ParsePolicy(s)
		if err != nil || p.String() != s {
			t.Fatalf("%s: %v %v", s, p, err)
		}
	}
	if _, err := ParsePolicy("write-sideways"); err == nil {
		t.Fatal("unknown policy accepted")
	}
	// Values above MaxValueBytes go around the tier and still round-trip.
	tr := newTier(t, store.NewMem(0), Config{ArenaBytes: 4 * mib, Shards: 2, MaxValueBytes: 64 * kib})
	put(t, tr, key(1), val(1, 100*kib))
	if got := get(t, tr, key(1)); !bytes.Equal(got, val(1, 100*kib)) {
		t.Fatal("large value wrong")
	}
	if rs := tr.RAMStats(); rs.Objects != 0 || rs.Bypassed == 0 {
		t.Fatalf("large value cached: %+v", rs)
	}
}
