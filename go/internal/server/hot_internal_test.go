package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

// fakePeers records pushes and invalidations; down addresses fail.
type fakePeers struct {
	mu          sync.Mutex
	addrs       []string
	pushes      map[string]int
	invalidated map[string]int
	down        map[string]bool
	reads       map[string]uint64 // what each replica reports at its next push
	moved       bool              // the ring moved: this node no longer owns the keys
}

func newFakePeers(addrs ...string) *fakePeers {
	return &fakePeers{addrs: addrs, pushes: map[string]int{}, invalidated: map[string]int{}, down: map[string]bool{}, reads: map[string]uint64{}}
}

func (f *fakePeers) Replicas(_ identity.ObjectID, n int) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addrs[:min(n, len(f.addrs))], !f.moved
}

var errDown = errors.New("peer down")

func (f *fakePeers) Push(_ context.Context, addr string, _ store.Key, _ uint64, _ time.Duration, _ []byte) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[addr] {
		return 0, errDown
	}
	f.pushes[addr]++
	n := f.reads[addr]
	f.reads[addr] = 0
	return n, nil
}

func (f *fakePeers) Invalidate(_ context.Context, addr string, _ store.Key, _ uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[addr] {
		return errDown
	}
	f.invalidated[addr]++
	return nil
}

func hotKeyN(i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i)*0x9e3779b97f4a7c15 + 1, Lo: uint64(i)}}
}

func newTestHot(t *testing.T, peers HotPeers, lease time.Duration) (*Hot, store.Engine) {
	t.Helper()
	eng := store.NewMem(64 << 20)
	h, err := NewHot(HotConfig{Peers: peers, MinReads: 64, Share: 0.1, MaxReplicas: 3, Lease: lease, RPCTimeout: 50 * time.Millisecond}, eng, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return h, eng
}

func putValue(t *testing.T, eng store.Engine, key store.Key, b byte) {
	t.Helper()
	if err := eng.Put(key, 64, func(dst []byte) error {
		for i := range dst {
			dst[i] = b
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The threshold: one dominant key gets replicas; a flat key population (the synthetic
// trace's shape) and a warm-but-not-dominant key do not.
func TestHotThreshold(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keys      int
		readsEach int
		hotReads  int // reads of key 0 on top
		want      int // replicas of key 0 expected
	}{
		{"one dominant key", 200, 20, 2000, 3},
		{"flat population", 2000, 5, 0, 0},
		{"flat, many reads each", 200, 100, 0, 0},
		{"warm key, 5% of reads", 200, 20, 200, 0},
		{"cold node", 10, 1, 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers := newFakePeers("b:1", "c:1", "d:1", "e:1")
			h, eng := newTestHot(t, peers, time.Second)
			for i := 0; i < tc.keys; i++ {
				putValue(t, eng, hotKeyN(i), byte(i))
			}
			for r := 0; r < tc.readsEach; r++ {
				for i := 0; i < tc.keys; i++ {
					h.noteRead(hotKeyN(i))
				}
			}
			for r := 0; r < tc.hotReads; r++ {
				h.noteRead(hotKeyN(0))
			}
			h.tick(false)
			got := 0
			if hint := h.noteRead(hotKeyN(0)); hint.Replicas > 0 {
				got = int(hint.Replicas)
			}
			if got != tc.want {
				t.Fatalf("key 0 has %d replicas, want %d", got, tc.want)
			}
			h.mu.Lock()
			n := len(h.entries)
			h.mu.Unlock()
			if tc.want == 0 && n != 0 {
				t.Fatalf("%d keys replicated, want none", n)
			}
			if tc.want > 0 && n != 1 {
				t.Fatalf("%d keys replicated, want only the dominant one", n)
			}
		})
	}
}

// A write of a replicated key invalidates every replica before it returns; an unreachable
// replica is waited out (its lease), and the hint is withdrawn at once.
func TestHotWriteInvalidates(t *testing.T) {
	peers := newFakePeers("b:1", "c:1")
	lease := 300 * time.Millisecond
	h, eng := newTestHot(t, peers, lease)
	key := hotKeyN(7)
	putValue(t, eng, key, 1)
	heat := func() {
		for i := 0; i < 500; i++ {
			h.noteRead(key)
		}
		for i := 100; i < 400; i++ { // a background of other keys: the mean the hot key is far above
			h.noteRead(hotKeyN(i))
		}
		h.tick(false)
	}
	heat()
	if hint := h.noteRead(key); hint.Replicas != 2 {
		t.Fatalf("hint %+v, want 2 replicas", hint)
	}
	h.wrote(key)
	if peers.invalidated["b:1"] != 1 || peers.invalidated["c:1"] != 1 {
		t.Fatalf("invalidations %v, want one per replica", peers.invalidated)
	}
	if hint := h.noteRead(key); hint.Replicas != 0 {
		t.Fatalf("hint %+v after a write, want none", hint)
	}
	heat()
	peers.mu.Lock()
	peers.down["c:1"] = true
	peers.mu.Unlock()
	start := time.Now()
	h.wrote(key)
	if d := time.Since(start); d < lease/2 {
		t.Fatalf("write returned after %v with a replica unreachable; want it to wait out the %v lease", d, lease)
	}
}

// A replica refuses an older generation after an invalidation, serves only inside its
// lease, and never serves bytes that do not match its CRC.
func TestHotReplicaGenerations(t *testing.T) {
	h, eng := newTestHot(t, newFakePeers(), 200*time.Millisecond)
	key := hotKeyN(3)
	fill := func(b byte) func([]byte) error {
		return func(dst []byte) error {
			for i := range dst {
				dst[i] = b
			}
			return nil
		}
	}
	read := func() (byte, error) {
		var got byte
		err := h.getReplica(key, func(v []byte) error { got = v[0]; return nil })
		return got, err
	}
	if err := h.putReplica(key, 10, time.Second, 32, fill('a')); err != nil {
		t.Fatal(err)
	}
	if b, err := read(); err != nil || b != 'a' {
		t.Fatalf("read %q, %v; want 'a'", b, err)
	}
	h.invalidateReplica(key, 11)
	if _, err := read(); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read after invalidation: %v, want not found", err)
	}
	if err := h.putReplica(key, 10, time.Second, 32, fill('a')); !errors.Is(err, errReplicaStale) {
		t.Fatalf("late push of generation 10 after invalidation 11: %v, want refused", err)
	}
	if err := h.putReplica(key, 12, 100*time.Millisecond, 32, fill('b')); err != nil {
		t.Fatal(err)
	}
	// Foreign bytes under the replica's engine key fail the CRC: a miss, not wrong bytes.
	if err := eng.Put(replicaKey(key), 32, fill('x')); err != nil {
		t.Fatal(err)
	}
	if _, err := read(); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read of replaced bytes: %v, want not found", err)
	}
	if err := h.putReplica(key, 13, 100*time.Millisecond, 32, fill('c')); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if _, err := read(); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read past the lease: %v, want not found", err)
	}
}

// A key that passes MinReads a quarter interval or more before the interval's end gets its
// replicas then, not at the tick: until they exist its primary serves every read alone. The
// shortened interval's threshold is scaled, so a warm key does not pass it by being counted
// over less time.
func TestHotEarlyTick(t *testing.T) {
	peers := newFakePeers("b:1", "c:1", "d:1")
	eng := store.NewMem(64 << 20)
	interval := 4 * time.Second
	h, err := NewHot(HotConfig{Peers: peers, Interval: interval, MinReads: 64, Share: 0.1, MaxReplicas: 3, Lease: 10 * time.Second,
		RPCTimeout: 50 * time.Millisecond}, eng, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	key := hotKeyN(1)
	putValue(t, eng, key, 1)
	for i := 100; i < 140; i++ {
		putValue(t, eng, hotKeyN(i), byte(i))
	}
	h.Start()
	defer h.Close()
	start := time.Now()
	time.Sleep(interval / 4)
	for i := 100; i < 140; i++ { // the background the hot key stands out from
		h.noteRead(hotKeyN(i))
	}
	for range 64 {
		h.noteRead(key)
	}
	for h.noteRead(key).Replicas == 0 {
		if time.Since(start) >= interval {
			t.Fatalf("no replicas before the interval's end (%v)", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.noteRead(key).Replicas; got != 3 {
		t.Fatalf("%d replicas, want 3", got)
	}
}

// A renewal (a newer generation pushed while the held copy is valid) keeps the copy servable
// while its bytes arrive; a push after an invalidation does not, and bytes that differ from
// the held copy's are never served under its CRC.
func TestHotRenewalKeepsServing(t *testing.T) {
	h, _ := newTestHot(t, newFakePeers(), time.Second)
	key := hotKeyN(4)
	read := func() (byte, error) {
		var got byte
		err := h.getReplica(key, func(v []byte) error { got = v[0]; return nil })
		return got, err
	}
	// push runs a push of gen whose bytes are b, and calls during() while they arrive.
	push := func(gen uint64, b byte, during func()) error {
		return h.putReplica(key, gen, time.Second, 32, func(dst []byte) error {
			during()
			for i := range dst {
				dst[i] = b
			}
			return nil
		})
	}
	if err := push(1, 'a', func() {}); err != nil {
		t.Fatal(err)
	}
	if err := push(2, 'a', func() {
		if b, err := read(); err != nil || b != 'a' {
			t.Errorf("read during a renewal: %q, %v; want 'a'", b, err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if b, err := read(); err != nil || b != 'a' {
		t.Fatalf("read after the renewal: %q, %v", b, err)
	}
	h.invalidateReplica(key, 3)
	if err := push(4, 'b', func() {
		if _, err := read(); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("read during a push after an invalidation: %v, want not found", err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if b, err := read(); err != nil || b != 'b' {
		t.Fatalf("read after the push: %q, %v; want 'b'", b, err)
	}
}

// With skipPrimaryFrom replicas the hint takes the primary out of the readers' rotation;
// the primary then sees few reads of the key and keeps it hot on what its replicas report
// at each renewal. Without the reports the same primary lets the key cool.
func TestHotSkipPrimaryKeptHotByReports(t *testing.T) {
	for _, tc := range []struct {
		name     string
		report   uint64 // reads each replica reports per interval
		wantKept bool
	}{
		{"replicas report their reads", 120, true},
		{"no reports (an older replica)", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := []string{"b:1", "c:1", "d:1", "e:1", "f:1", "g:1"}
			peers := newFakePeers(addrs...)
			eng := store.NewMem(64 << 20)
			h, err := NewHot(HotConfig{Peers: peers, MinReads: 64, Share: 0.1, MaxReplicas: len(addrs), Lease: time.Minute, RPCTimeout: 50 * time.Millisecond}, eng, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			key := hotKeyN(1)
			putValue(t, eng, key, 1)
			background := func() {
				for i := 100; i < 400; i++ {
					h.noteRead(hotKeyN(i))
				}
			}
			for i := 0; i < 2000; i++ {
				h.noteRead(key)
			}
			background()
			h.tick(false)
			hint := h.noteRead(key)
			if hint.Replicas < skipPrimaryFrom || !hint.SkipPrimary {
				t.Fatalf("hint %+v, want at least %d replicas and the primary skipped", hint, skipPrimaryFrom)
			}
			// Readers now go to the replicas: the primary sees a handful (misses, late hints).
			for round := 0; round < quietRounds+2; round++ {
				peers.mu.Lock()
				for _, a := range addrs {
					peers.reads[a] = tc.report
				}
				peers.mu.Unlock()
				for i := 0; i < 5; i++ {
					h.noteRead(key)
				}
				background()
				h.tick(false)
			}
			kept := h.noteRead(key).Replicas > 0
			if kept != tc.wantKept {
				t.Fatalf("after %d intervals served by the replicas: still spread %v, want %v (reported %d reads per replica)", quietRounds+2, kept, tc.wantKept, tc.report)
			}
		})
	}
}

// A replica counts the reads it serves and hands the count to the next push's reply.
func TestReplicaReadsReported(t *testing.T) {
	h, _ := newTestHot(t, newFakePeers(), time.Second)
	key := hotKeyN(5)
	fill := func(dst []byte) error {
		for i := range dst {
			dst[i] = 7
		}
		return nil
	}
	if err := h.putReplica(key, 1, time.Second, 32, fill); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 9; i++ {
		if err := h.getReplica(key, func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.getReplica(hotKeyN(6), func([]byte) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("replica of an unpushed key: %v, want a miss", err)
	}
	if n := h.takeReplicaReads(key); n != 9 {
		t.Fatalf("reported %d reads, want 9", n)
	}
	if n := h.takeReplicaReads(key); n != 0 {
		t.Fatalf("reported %d reads a second time, want 0", n)
	}
}

// A renewal that pushes nothing (the ring moved) clears the replicas' last reported reads,
// so a key whose replicas cannot be reached for their invalidation does not look hot on an
// old report.
func TestHotReportClearedWhenNothingPushed(t *testing.T) {
	addrs := []string{"b:1", "c:1", "d:1"}
	peers := newFakePeers(addrs...)
	h, eng := newTestHot(t, peers, time.Minute)
	key := hotKeyN(2)
	putValue(t, eng, key, 1)
	heat := func() {
		for i := 0; i < 2000; i++ {
			h.noteRead(key)
		}
		for i := 100; i < 400; i++ {
			h.noteRead(hotKeyN(i))
		}
		h.tick(false)
	}
	heat()
	peers.mu.Lock()
	for _, a := range addrs {
		peers.reads[a] = 500
	}
	peers.mu.Unlock()
	heat() // the renewal collects the reports
	entry := func() *hotEntry {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.entries[key]
	}
	if e := entry(); e == nil || e.reported.Load() != 1500 {
		t.Fatalf("entry %v: want 1500 reads reported by the renewal", e)
	}
	peers.mu.Lock()
	peers.moved = true
	for _, a := range addrs {
		peers.down[a] = true // invalidations fail: the entry stays while the leases run
	}
	peers.mu.Unlock()
	heat()
	e := entry()
	if e == nil {
		t.Fatal("entry gone although its replicas could not be invalidated")
	}
	if n := e.reported.Load(); n != 0 {
		t.Fatalf("%d reads still reported after a renewal that pushed nothing, want 0", n)
	}
}
