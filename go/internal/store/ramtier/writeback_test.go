//go:build linux

package ramtier

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/testutil"
)

func openSlabDir(t testing.TB, dir string) *slab.Engine {
	t.Helper()
	e, err := slab.Open(slab.Config{Dir: dir, CapacityBytes: 64 * mib, ExtentBytes: 8 * mib,
		MaxValueBytes: 4 * mib, BufferPoolBytes: 16 * mib, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// newWB returns a write-back tier over a slab engine in dir; the caller closes it.
func newWB(t testing.TB, dir string, cfg Config) (*Tier, *slab.Engine) {
	t.Helper()
	e := openSlabDir(t, dir)
	cfg.Policy, cfg.Logger = WriteBack, quiet
	tr, err := New(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr, e
}

// reopen returns what the disk holds for key k after the tier was closed.
func diskValue(t testing.TB, dir string, k store.Key) ([]byte, error) {
	t.Helper()
	e := openSlabDir(t, dir)
	defer e.Close()
	var out []byte
	err := e.Get(k, func(v []byte) error { out = bytes.Clone(v); return nil })
	return out, err
}

func TestWriteBackAcksBeforeDiskAndDrainsOnClose(t *testing.T) {
	dir := t.TempDir()
	tr, disk := newWB(t, dir, Config{ArenaBytes: 8 * mib, Shards: 2, StallFlush: true})
	v := val(1, 300*kib)
	put(t, tr, key(1), v)
	if _, err := disk.Stat(key(1)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("stalled flusher, yet the value is on disk: %v", err)
	}
	if got := get(t, tr, key(1)); !bytes.Equal(got, v) {
		t.Fatal("dirty value read back wrong")
	}
	if rs := tr.RAMStats(); rs.DirtyBytes != store.AlignUp(300*kib) || rs.FlushBacklog != 1 || !rs.WriteBack {
		t.Fatalf("stats %+v", rs)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if rs := tr.RAMStats(); rs.Flushed != 1 || rs.DirtyBytes != 0 {
		t.Fatalf("after drain %+v", rs)
	}
	if got, err := diskValue(t, dir, key(1)); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("after drain the disk holds %d bytes (%v)", len(got), err)
	}
}

// An overwrite of a durable value makes the old version unreachable before its ack: a
// crash before the flush then leaves a miss, not the old version.
func TestWriteBackOverwriteRemovesDurableVersionBeforeAck(t *testing.T) {
	dir := t.TempDir()
	e := openSlabDir(t, dir)
	put(t, e, key(2), versionVal(2, 0))
	e.Close()
	tr, disk := newWB(t, dir, Config{ArenaBytes: 8 * mib, Shards: 2, StallFlush: true})
	put(t, tr, key(2), versionVal(2, 1))
	if _, err := disk.Stat(key(2)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("old version still reachable on disk after the ack: %v", err)
	}
	if got := get(t, tr, key(2)); !bytes.Equal(got, versionVal(2, 1)) {
		t.Fatal("tier serves the wrong version")
	}
	if rs := tr.RAMStats(); rs.Tombstones != 1 {
		t.Fatalf("tombstones %d", rs.Tombstones)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := diskValue(t, dir, key(2)); err != nil || !bytes.Equal(got, versionVal(2, 1)) {
		t.Fatalf("after drain: %v", err)
	}
}

// A slot overwritten before its flush is never written; only the latest bytes reach disk.
func TestWriteBackOverwrittenSlotFlushedOnce(t *testing.T) {
	dir := t.TempDir()
	tr, _ := newWB(t, dir, Config{ArenaBytes: 8 * mib, Shards: 2, StallFlush: true})
	for ver := 0; ver < 5; ver++ {
		put(t, tr, key(3), versionVal(3, ver))
	}
	put(t, tr, key(4), val(4, 10*kib))
	if err := tr.Remove(key(4)); err != nil { // dirty only: removing it is not an error
		t.Fatal(err)
	}
	if err := tr.Remove(key(4)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if rs := tr.RAMStats(); rs.Flushed != 1 || rs.FlushDropped != 5 {
		t.Fatalf("flushed %d dropped %d, want 1 and 5", rs.Flushed, rs.FlushDropped)
	}
	if got, err := diskValue(t, dir, key(3)); err != nil || !bytes.Equal(got, versionVal(3, 4)) {
		t.Fatalf("disk does not hold the latest version: %v", err)
	}
	if _, err := diskValue(t, dir, key(4)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removed dirty key reached the disk: %v", err)
	}
}

// A full dirty budget makes a PUT wait, bounded, then fail with ErrBusy; dirty slots are
// never evicted while the arena is full of them; nothing acknowledged is lost at Close.
func TestWriteBackBudgetFullIsBusyAndDirtyNeverEvicted(t *testing.T) {
	dir := t.TempDir()
	tr, _ := newWB(t, dir, Config{ArenaBytes: 2 * mib, Shards: 1, DirtyBytes: 2 * mib,
		DirtyWait: 30 * time.Millisecond, WaitTimeout: 20 * time.Millisecond, StallFlush: true})
	const n = 8
	for i := 0; i < n; i++ {
		put(t, tr, key(10+i), val(10+i, 256*kib))
	}
	start := time.Now()
	err := tr.Put(key(99), 256*kib, func(dst []byte) error { t.Error("filled while busy"); return nil })
	if !errors.Is(err, store.ErrBusy) {
		t.Fatalf("full budget: %v", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 10*time.Second {
		t.Fatalf("busy after %v, want the 30ms bounded wait", d)
	}
	rs := tr.RAMStats()
	if rs.DirtyBusy != 1 || rs.DirtyWaits != 1 || rs.Evictions != 0 || rs.Objects != n {
		t.Fatalf("stats %+v", rs)
	}
	for i := 0; i < n; i++ {
		if got := get(t, tr, key(10+i)); !bytes.Equal(got, val(10+i, 256*kib)) {
			t.Fatalf("key %d wrong", i)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if got, err := diskValue(t, dir, key(10+i)); err != nil || !bytes.Equal(got, val(10+i, 256*kib)) {
			t.Fatalf("key %d lost after drain: %v", i, err)
		}
	}
}

// Values larger than the tier takes go straight to disk and drop a dirty older version, so
// its flush cannot land over them.
func TestWriteBackLargeValueSupersedesDirty(t *testing.T) {
	dir := t.TempDir()
	tr, _ := newWB(t, dir, Config{ArenaBytes: 4 * mib, Shards: 2, MaxValueBytes: 64 * kib, StallFlush: true})
	put(t, tr, key(5), val(5, 16*kib))
	put(t, tr, key(5), val(5, 100*kib))
	if got := get(t, tr, key(5)); !bytes.Equal(got, val(5, 100*kib)) {
		t.Fatal("large value not served")
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := diskValue(t, dir, key(5)); err != nil || !bytes.Equal(got, val(5, 100*kib)) {
		t.Fatalf("disk holds %d bytes (%v)", len(got), err)
	}
}

// Concurrent writers, removers and readers with live flushers: reads only ever see bytes
// of some written version, and after Close the disk holds each key's last write.
func TestWriteBackConcurrentOverwrites(t *testing.T) {
	dir := t.TempDir()
	tr, _ := newWB(t, dir, Config{ArenaBytes: 4 * mib, Shards: 2, DirtyBytes: 1 * mib, FlushThreads: 3,
		DirtyWait: 2 * time.Second, Coalesce: true})
	const writers, keysPer, versions = 4, 3, 60
	var wg sync.WaitGroup
	last := make([][]int, writers) // last[w][j]: last version written, -1 removed
	for w := 0; w < writers; w++ {
		last[w] = make([]int, keysPer)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for ver := 0; ver < versions; ver++ {
				j := ver % keysPer
				k := w*keysPer + j
				if ver%11 == 5 {
					if err := tr.Remove(key(k)); err != nil && !errors.Is(err, store.ErrNotFound) {
						t.Error(err)
					}
					last[w][j] = -1
					continue
				}
				if err := tr.Put(key(k), len(versionVal(k, ver)), func(d []byte) error { copy(d, versionVal(k, ver)); return nil }); err != nil {
					t.Error(err)
					return
				}
				last[w][j] = ver
			}
		}(w)
	}
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				k := (r + i) % (writers * keysPer)
				err := tr.Get(key(k), func(v []byte) error {
					ver := int(v[0]) | int(v[1])<<8
					if ver >= versions || !bytes.Equal(v, versionVal(k, ver)) {
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
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	for w := 0; w < writers; w++ {
		for j := 0; j < keysPer; j++ {
			k := w*keysPer + j
			got, err := diskValue(t, dir, key(k))
			if last[w][j] < 0 {
				if !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("key %d removed last, disk has it (%v)", k, err)
				}
				continue
			}
			if err != nil || !bytes.Equal(got, versionVal(k, last[w][j])) {
				t.Fatalf("key %d: disk is not version %d (%v)", k, last[w][j], err)
			}
		}
	}
}

// gatedPut blocks every Put until gate is closed: a disk that stopped answering.
type gatedPut struct {
	store.Engine
	gate chan struct{}
}

func (g *gatedPut) Put(k store.Key, size int, fill func([]byte) error) error {
	<-g.gate
	return g.Engine.Put(k, size, fill)
}

// A drain that cannot finish is bounded by DrainTimeout and logged with what was left.
func TestWriteBackDrainTimeoutIsLogged(t *testing.T) {
	g := &gatedPut{Engine: store.NewMem(0), gate: make(chan struct{})}
	var logBuf lockedBuf
	tr, err := New(g, Config{ArenaBytes: 4 * mib, Shards: 2, Policy: WriteBack, DrainTimeout: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	put(t, tr, key(1), val(1, 8*kib))
	put(t, tr, key(2), val(2, 8*kib))
	done := make(chan error, 1)
	go func() { done <- tr.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the drain timeout")
	}
	close(g.gate) // let the stuck flusher finish (the arena stayed mapped for it)
	if s := logBuf.String(); !strings.Contains(s, "drain timeout hit") || !strings.Contains(s, "slots_left") {
		t.Fatalf("drain timeout not logged:\n%s", s)
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWriteBackFlushBatches: one flusher drains a queue in batches; two keys of one stripe
// queued back to back land in one batch, so the second goes back to the queue (the
// flusher already holds that stripe) and is flushed later; a slot overwritten while dirty
// is dropped; every key ends on disk with its latest value.
func TestWriteBackFlushBatches(t *testing.T) {
	dir := t.TempDir()
	tr, _ := newWB(t, dir, Config{ArenaBytes: 16 * mib, Shards: 2, FlushThreads: 1, StallFlush: true})
	const size = 64 * kib
	twin := 1000
	for tr.stripeOf(key(twin)) != tr.stripeOf(key(0)) {
		twin++
	}
	keys := []int{0, twin}
	for i := 1; i <= 20; i++ {
		keys = append(keys, i)
	}
	for _, k := range keys {
		put(t, tr, key(k), val(k, size))
	}
	put(t, tr, key(5), val(500, size)) // overwrites a dirty slot: the first is never written
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	rs := tr.RAMStats()
	if rs.Flushed != int64(len(keys)) || rs.FlushDropped != 1 || rs.FlushErrors != 0 || rs.DirtyBytes != 0 {
		t.Fatalf("after drain: flushed %d (want %d), dropped %d (want 1), errors %d, dirty %d",
			rs.Flushed, len(keys), rs.FlushDropped, rs.FlushErrors, rs.DirtyBytes)
	}
	for _, k := range keys {
		want := val(k, size)
		if k == 5 {
			want = val(500, size)
		}
		if got, err := diskValue(t, dir, key(k)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("key %d on disk: %d bytes, %v", k, len(got), err)
		}
	}
}

// startBlockedPut starts a write-back PUT of size bytes whose payload does not arrive
// until the returned func is called (it then waits for the PUT's outcome): while it is
// open the tier sees a PUT stream in progress.
func startBlockedPut(t *testing.T, tr *Tier, k store.Key, size int) (finish func()) {
	t.Helper()
	release, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- tr.Put(k, size, func(dst []byte) error { <-release; clear(dst); return nil })
	}()
	testutil.WaitFor(t, 10*time.Second, "the blocked PUT to start", func() bool { return tr.wb.putting.Load() == 1 })
	var once sync.Once
	return func() { // idempotent: also deferred, so that a failed test does not hang in Close
		once.Do(func() {
			close(release)
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// While a PUT stream is in progress and the budget has room, flushers hold off; once the
// stream pauses they flush at once.
func TestWriteBackFlushDefersToPUTStream(t *testing.T) {
	tr, _ := newWB(t, t.TempDir(), Config{ArenaBytes: 8 * mib, Shards: 2, DirtyBytes: 4 * mib, FlushDefer: time.Minute})
	defer tr.Close()
	finish := startBlockedPut(t, tr, key(1), mib)
	put(t, tr, key(2), val(2, mib))
	// The flushers have looked at the queued value several times and held off each time.
	testutil.WaitFor(t, 10*time.Second, "flushers to defer", func() bool { return tr.RAMStats().FlushDeferrals >= 5 })
	if rs := tr.RAMStats(); rs.Flushed != 0 || rs.FlushBacklog != 1 {
		t.Fatalf("flushed during the PUT stream: %+v", rs)
	}
	finish()
	testutil.WaitFor(t, 10*time.Second, "both values flushed after the stream paused",
		func() bool { return tr.RAMStats().Flushed == 2 })
}

// The deferral ends when the dirty bytes reach 15/16 of the budget (until they are under
// 1/2, and for the rest of that stream of PUTs), when a value has waited FlushDefer, and
// never starts when it is off.
func TestWriteBackFlushDeferBounds(t *testing.T) {
	t.Run("budget 15/16 full", func(t *testing.T) {
		tr, _ := newWB(t, t.TempDir(), Config{ArenaBytes: 16 * mib, Shards: 2, DirtyBytes: 4 * mib, FlushDefer: time.Minute})
		defer tr.Close()
		finish := startBlockedPut(t, tr, key(1), mib) // holds 1 MiB of the budget
		defer finish()
		put(t, tr, key(2), val(2, mib))
		put(t, tr, key(3), val(3, mib)) // 3 MiB dirty: 3/4 of the budget, still a burst
		d := tr.RAMStats().FlushDeferrals
		testutil.WaitFor(t, 10*time.Second, "flushers to defer at 3/4", func() bool { return tr.RAMStats().FlushDeferrals >= d+5 })
		if rs := tr.RAMStats(); rs.Flushed != 0 {
			t.Fatalf("flushed %d with the budget 3/4 full, want the deferral to hold", rs.Flushed)
		}
		put(t, tr, key(4), val(4, mib)) // 4 MiB dirty: the budget is full
		// Flushes run until the dirty bytes are under 1/2 of the budget: the three values
		// (the blocked PUT's megabyte stays charged).
		testutil.WaitFor(t, 10*time.Second, "the flushes with the budget full",
			func() bool { return tr.RAMStats().Flushed == 3 })
		// Under 1/2 again but the same stream (the blocked PUT still in progress): a stream
		// that filled the budget is sustained, so the flushers keep writing.
		put(t, tr, key(5), val(5, mib))
		testutil.WaitFor(t, 10*time.Second, "the flush within the same stream",
			func() bool { return tr.RAMStats().Flushed == 4 })
		finish() // the stream pauses: the blocked PUT's value is flushed at once
		testutil.WaitFor(t, 10*time.Second, "the flush after the stream paused",
			func() bool { return tr.RAMStats().Flushed == 5 })
		// A new stream under 1/2 of the budget is a burst again.
		time.Sleep(2 * putIdleGap)
		finish2 := startBlockedPut(t, tr, key(6), mib)
		defer finish2()
		put(t, tr, key(7), val(7, mib))
		d = tr.RAMStats().FlushDeferrals
		testutil.WaitFor(t, 10*time.Second, "flushers to defer again", func() bool { return tr.RAMStats().FlushDeferrals >= d+5 })
		if rs := tr.RAMStats(); rs.Flushed != 5 {
			t.Fatalf("flushed %d in a new stream under 1/2 of the budget, want the deferral back", rs.Flushed)
		}
	})
	t.Run("oldest value waited FlushDefer", func(t *testing.T) {
		const deferFor = 50 * time.Millisecond
		tr, _ := newWB(t, t.TempDir(), Config{ArenaBytes: 8 * mib, Shards: 2, DirtyBytes: 4 * mib, FlushDefer: deferFor})
		defer tr.Close()
		finish := startBlockedPut(t, tr, key(1), mib)
		defer finish()
		acked := time.Now()
		put(t, tr, key(2), val(2, mib))
		testutil.WaitFor(t, 10*time.Second, "the flush after FlushDefer", func() bool { return tr.RAMStats().Flushed == 1 })
		if waited := time.Since(acked); waited < deferFor {
			t.Fatalf("flushed %v after the ack, before FlushDefer (%v)", waited, deferFor)
		}
	})
	t.Run("off", func(t *testing.T) {
		tr, _ := newWB(t, t.TempDir(), Config{ArenaBytes: 8 * mib, Shards: 2, DirtyBytes: 4 * mib, FlushDefer: -1})
		defer tr.Close()
		finish := startBlockedPut(t, tr, key(1), mib)
		defer finish()
		put(t, tr, key(2), val(2, mib))
		testutil.WaitFor(t, 10*time.Second, "the flush", func() bool { return tr.RAMStats().Flushed == 1 })
		if d := tr.RAMStats().FlushDeferrals; d != 0 {
			t.Fatalf("%d deferrals with the deferral off", d)
		}
	})
}

// With the flushers the bottleneck (deferral off, or the budget 15/16 full) a PUT takes its
// CRC on receive and the flush stores it; while flushes may defer it is left to them.
// Either way the disk holds the exact bytes (the slab verifies the CRC on read).
func TestWriteBackCRCOnReceiveWhenFlushBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deferFor time.Duration
		onRecv   bool
		keyBase  int
	}{{"deferral off", -1, true, 10}, {"deferral on, budget empty", time.Minute, false, 20}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tr, _ := newWB(t, dir, Config{ArenaBytes: 8 * mib, Shards: 2, DirtyBytes: 4 * mib, FlushDefer: tc.deferFor, StallFlush: true})
			k, v := key(tc.keyBase), val(tc.keyBase, 300*kib)
			put(t, tr, k, v)
			sh := tr.shardOf(k)
			sh.mu.RLock()
			s := sh.index[k]
			hasCRC := s.hasCRC
			sh.mu.RUnlock()
			if hasCRC != tc.onRecv {
				t.Fatalf("CRC taken on receive: %v, want %v", hasCRC, tc.onRecv)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := diskValue(t, dir, k); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("after the flush the disk holds %d bytes (%v)", len(got), err)
			}
		})
	}
}
