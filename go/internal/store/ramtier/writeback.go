package ramtier

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// wbState is the write-back machinery: the dirty budget and the flush queue.
type wbState struct {
	mu      sync.Mutex
	work    *sync.Cond // flushers wait here for queued slots
	q       []*slot    // dirty slots in acknowledgement order, each pinned for its flusher
	stop    bool       // draining: flush what is queued, then exit
	stalled bool       // fault injection: flush nothing until draining
	wg      sync.WaitGroup

	bmu   sync.Mutex
	bwake chan struct{} // closed and replaced when dirty bytes are released while a PUT waits

	dirty, queued                                     atomic.Int64
	flushed, dropped, errors, waits, busy, tombstones atomic.Int64
	deferrals                                         atomic.Int64

	// The PUT stream that flushers defer to (see Config.FlushDefer).
	putting  atomic.Int32 // write-back PUTs in progress
	waiting  atomic.Int32 // PUTs waiting for dirty budget
	pressure atomic.Bool  // dirty bytes reached 15/16 of the budget, not yet back under 1/2
	lastPut  atomic.Int64 // Unix ns when the last one ended
	// A stream is PUTs with no pause of putIdleGap between them; streamGen counts them.
	// pressureGen is the stream that last brought pressure: a stream that filled the
	// budget is sustained, not a burst, and flushers never defer to it again (deferring
	// each time the flushes got it under 1/2 left the disk idle in a sawtooth).
	streamGen, pressureGen atomic.Int64
}

// putIdleGap is how long after the last write-back PUT the stream counts as paused: longer
// than the scheduling gaps between a client's back-to-back PUTs on a loaded machine, short
// against a flush. A deferring flusher looks again every deferPoll.
const (
	putIdleGap = 5 * time.Millisecond
	deferPoll  = time.Millisecond
)

func (t *Tier) startFlushers() {
	w := &t.wb
	w.work = sync.NewCond(&w.mu)
	w.bwake = make(chan struct{})
	w.pressureGen.Store(-1) // no stream has brought pressure yet
	w.stalled = t.cfg.StallFlush
	if w.stalled {
		t.log.Warn("ramtier: fault injection: flushers stalled until shutdown")
	}
	for range t.cfg.FlushThreads {
		w.wg.Add(1)
		go t.flusher()
	}
}

// acquireDirty charges n bytes to the dirty budget, waiting at most DirtyWait for
// flushes to release some; then it fails with store.ErrBusy. A value larger than the
// whole budget is admitted when nothing else is dirty.
func (t *Tier) acquireDirty(n int64) error {
	w := &t.wb
	var timer *time.Timer
	for {
		w.bmu.Lock()
		if d := w.dirty.Load(); d == 0 || d+n <= t.cfg.DirtyBytes {
			t.notePressure(w.dirty.Add(n))
			w.bmu.Unlock()
			return nil
		}
		if timer == nil {
			w.waits.Add(1)
			w.waiting.Add(1) // under bmu: a release after the unlock sees it and wakes us
			defer w.waiting.Add(-1)
			timer = time.NewTimer(t.cfg.DirtyWait)
			defer timer.Stop()
		}
		wake := w.bwake
		w.bmu.Unlock()
		select {
		case <-wake:
		case <-timer.C:
			w.busy.Add(1)
			return fmt.Errorf("ramtier: write-back dirty budget of %d bytes still full after %v: %w",
				t.cfg.DirtyBytes, t.cfg.DirtyWait, store.ErrBusy)
		}
	}
}

func (t *Tier) releaseDirty(n int64) {
	w := &t.wb
	w.bmu.Lock()
	t.notePressure(w.dirty.Add(-n))
	if w.waiting.Load() > 0 { // no channel to make per flushed slot while nobody waits
		close(w.bwake)
		w.bwake = make(chan struct{})
	}
	w.bmu.Unlock()
}

// putBack is Put under write-back: the value is acknowledged once it is in a dirty arena
// slot. An older durable version of the key is removed from disk first, so that a crash
// before the flush leaves a miss, never that older version.
func (t *Tier) putBack(key store.Key, st *stripe, sh *shard, size int, fill func([]byte) error) error {
	if size <= 0 || int64(size) > t.cfg.MaxValueBytes {
		t.bypassed.Add(1)
		return t.putAroundBack(key, st, sh, size, fill)
	}
	w := &t.wb
	if w.putting.Add(1) == 1 && time.Now().UnixNano()-w.lastPut.Load() >= int64(putIdleGap) {
		w.streamGen.Add(1) // racing starters may both count: a new stream either way
	}
	defer func() {
		w.lastPut.Store(time.Now().UnixNano())
		w.putting.Add(-1)
	}()
	n := store.AlignUp(int64(size))
	if err := t.acquireDirty(n); err != nil {
		return err
	}
	s, err := sh.reserve(key, n)
	if err != nil { // the arena is full of dirty or pinned slots: write through to disk
		t.releaseDirty(n)
		t.bypassed.Add(1)
		return t.putAroundBack(key, st, sh, size, fill)
	}
	buf := t.bytesOf(s)
	if err := fill(buf[:size]); err != nil {
		sh.abort(s)
		t.unpin(s)
		t.releaseDirty(n)
		return err
	}
	s.length = size
	// The flush's record needs the CRC32C. When the flushers are the bottleneck (they are
	// not deferring: the budget is 15/16 full or the deferral is off) it is taken now, over
	// bytes the socket copy just left in cache: about a third of the cold reread at flush
	// time. While flushes defer, it is left to them, off the burst's path.
	if s.hasCRC = !t.flushMayDefer(); s.hasCRC {
		s.crc = crc32.Checksum(buf[:size], castagnoli)
	}
	st.disk.Lock()
	if has, err := store.Has(t.backing, key); has || err != nil { // err: cannot tell, so remove
		if err := t.backing.Remove(key); err != nil && !errors.Is(err, store.ErrNotFound) {
			st.disk.Unlock()
			sh.abort(s)
			t.unpin(s)
			t.releaseDirty(n)
			return fmt.Errorf("ramtier: write-back: make the older version unreachable: %w", err)
		}
		t.wb.tombstones.Add(1)
	}
	s.pins.Add(1) // the flush queue's pin: the slot is not reused before its flusher is done
	s.ackedAt = time.Now().UnixNano()
	sh.publishDirty(s)
	st.disk.Unlock()
	t.unpin(s) // the owner's pin
	t.push(s)
	return nil
}

// putAroundBack writes a value that does not go into the arena straight to disk, dropping
// any dirty older version first (under the stripe's disk lock, so its flush cannot land
// after this write).
func (t *Tier) putAroundBack(key store.Key, st *stripe, sh *shard, size int, fill func([]byte) error) error {
	st.disk.Lock()
	defer st.disk.Unlock()
	sh.invalidate(key)
	err := t.backing.Put(key, size, fill)
	sh.invalidate(key)
	return err
}

func (t *Tier) push(s *slot) {
	w := &t.wb
	w.mu.Lock()
	w.q = append(w.q, s)
	w.queued.Add(1)
	w.work.Signal()
	w.mu.Unlock()
}

// flushCheckedHook, when set (tests only, before New), runs in every flush after its slots
// were checked current and before they are written, with their stripes' disk locks held.
var flushCheckedHook func()

// Flush batches: a flusher takes up to flushBatch dirty slots (at most flushBatchBytes, a
// larger value alone) and writes them with one store.PutFromBatch, so a slab makes their
// records durable with one table fsync instead of one per value. A flusher takes no more
// than its share of the queue, so that the others keep their writes in flight too.
const (
	flushBatch      = 8
	flushBatchBytes = 16 << 20
)

func (t *Tier) flusher() {
	w := &t.wb
	defer w.wg.Done()
	batch := make([]*slot, 0, flushBatch)
	for {
		w.mu.Lock()
		for (len(w.q) == 0 || w.stalled) && !w.stop {
			w.work.Wait()
		}
		if len(w.q) == 0 {
			w.mu.Unlock()
			return
		}
		if d := t.flushDefer(time.Now().UnixNano()); d > 0 {
			w.mu.Unlock()
			w.deferrals.Add(1)
			time.Sleep(d)
			continue
		}
		take := min(flushBatch, max(1, len(w.q)/t.cfg.FlushThreads))
		batch = batch[:0]
		var bytes int64
		for len(batch) < take && len(w.q) > 0 {
			s := w.q[0]
			if len(batch) > 0 && bytes+s.n > flushBatchBytes {
				break
			}
			bytes += s.n
			batch = append(batch, s)
			w.q[0] = nil
			w.q = w.q[1:]
		}
		w.queued.Add(-int64(len(batch)))
		w.mu.Unlock()
		t.flush(batch)
	}
}

// flushDefer says how long a flusher should hold off before taking the queue's head
// (w.mu held, queue not empty): while PUTs stream in, the budget is under 15/16 full, no PUT
// waits for it and the oldest dirty value is younger than FlushDefer. It sleeps at most
// deferPoll at a time, so the flush starts within about putIdleGap of the stream's pause.
func (t *Tier) flushDefer(now int64) time.Duration {
	w := &t.wb
	if w.stop || !t.flushMayDefer() {
		return 0
	}
	if w.putting.Load() == 0 && now-w.lastPut.Load() >= int64(putIdleGap) {
		return 0
	}
	left := int64(t.cfg.FlushDefer) - (now - w.q[0].ackedAt)
	if left <= 0 {
		return 0
	}
	return min(time.Duration(left), deferPoll)
}

// flushMayDefer reports whether the budget leaves the flushers room to defer: deferral on,
// no PUT waiting for budget, no budget pressure (see notePressure), and the current
// stream has not brought pressure before.
func (t *Tier) flushMayDefer() bool {
	w := &t.wb
	return t.cfg.FlushDefer > 0 && w.waiting.Load() == 0 && !w.pressure.Load() &&
		w.pressureGen.Load() != w.streamGen.Load()
}

// notePressure follows the dirty bytes d (w.bmu held, so updates land in order): pressure
// starts when they reach 15/16 of the budget and lasts until they are under 1/2, so that a
// sustained stream keeps every flusher writing instead of stopping them each time a flush
// dips under the mark.
//
// Why so late: flushing during a burst costs the burst its CPU (the flush's CRC pass over
// values long out of cache, the O_DIRECT writes), and a burst that fits the budget needs no
// flush until it is over. The last 1/16 is the room the flushers need to get going before a
// PUT would wait. With pressure from 3/4, bursts of 0.9 of a 4 GiB budget ran at 0.63x
// memcached's PUT (median of 5 rounds); from 15/16 at 0.91-0.96x (docs/BENCHMARKS.md,
// "Write path and cold reads").
func (t *Tier) notePressure(d int64) {
	switch w := &t.wb; {
	case d >= pressureMark(t.cfg.DirtyBytes):
		w.pressure.Store(true)
		w.pressureGen.Store(w.streamGen.Load())
	case d < t.cfg.DirtyBytes/2:
		w.pressure.Store(false)
	}
}

// pressureMark is the dirty bytes from which the flushers stop deferring: 15/16 of budget.
func pressureMark(budget int64) int64 { return budget - budget/16 }

// requeue puts slots a flusher could not take now back at the head of the queue.
func (t *Tier) requeue(slots []*slot) {
	w := &t.wb
	w.mu.Lock()
	w.q = append(slices.Clone(slots), w.q...)
	w.queued.Add(int64(len(slots)))
	w.work.Signal()
	w.mu.Unlock()
}

// flush writes a batch of dirty slots to disk, each only if it is still its key's value; a
// slot overwritten or removed before its turn is dropped unwritten. Each slot's stripe
// disk lock is held from the check until its state reflects the write. The first is
// waited for; the others are only tried (a flusher never waits while holding one, so
// flushers cannot deadlock), and a slot whose stripe is busy (or already held by this
// batch: same stripe, possibly the same key) goes back to the queue.
func (t *Tier) flush(batch []*slot) {
	var (
		held  [flushBatch]*stripe
		cur   [flushBatch]bool
		items [flushBatch]store.DirectItem
		errs  [flushBatch]error
		idx   [flushBatch]int // items[j] is batch[idx[j]]
	)
	n, ni := 0, 0
	for i, s := range batch {
		st := t.stripeOf(s.key)
		if i == 0 {
			st.disk.Lock()
		} else if !st.disk.TryLock() {
			t.requeue(batch[i:])
			break
		}
		held[i] = st
		n = i + 1
		sh := s.sh
		sh.mu.RLock()
		cur[i] = s.state == slotDirty && sh.index[s.key] == s
		sh.mu.RUnlock()
		if cur[i] {
			items[ni] = store.DirectItem{Key: s.key, Src: t.bytesOf(s), Size: s.length, CRC: s.crc, HasCRC: s.hasCRC}
			idx[ni] = i
			ni++
		}
	}
	if ni > 0 {
		if hook := flushCheckedHook; hook != nil {
			hook() // tests: widen the window between the check and the write
		}
		store.PutFromBatch(t.backing, items[:ni], errs[:ni])
	}
	var failed [flushBatch]error
	for j := range ni {
		i := idx[j]
		s, err := batch[i], errs[j]
		failed[i] = err
		sh := s.sh
		sh.mu.Lock()
		if err == nil {
			s.state = slotLive // durable: evictable from now on
		} else if sh.index[s.key] == s {
			sh.killLocked(s)
		} else {
			s.state = slotDead
		}
		sh.wakeLocked()
		sh.mu.Unlock()
	}
	for i := range n {
		held[i].disk.Unlock()
	}
	for i := range n {
		s := batch[i]
		key, length := s.key, s.length
		switch {
		case !cur[i]:
			t.wb.dropped.Add(1)
			t.notifyGone(key, length, store.Replaced)
		case failed[i] != nil:
			t.wb.errors.Add(1)
			t.log.Error("ramtier: flush failed; the acknowledged value is lost (its key reads as a miss)",
				"size", length, "err", failed[i])
			t.notifyGone(key, length, store.Dropped)
		default:
			t.wb.flushed.Add(1)
		}
		t.releaseDirty(s.n)
		t.unpin(s)
	}
}

// notifyGone tells the outer observer (quota accounting) that an acknowledged value left
// without reaching the disk.
func (t *Tier) notifyGone(key store.Key, size int, why store.RemovalReason) {
	if fn := t.observer.Load(); fn != nil {
		(*fn)(key, int64(size), why)
	}
}

// drain flushes every queued dirty slot, at most DrainTimeout. It reports whether the
// flushers finished.
func (t *Tier) drain() bool {
	w := &t.wb
	start := time.Now()
	slots, bytes := w.queued.Load(), w.dirty.Load()
	w.mu.Lock()
	w.stop, w.stalled = true, false
	w.work.Broadcast()
	w.mu.Unlock()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	timer := time.NewTimer(t.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
		t.log.Info("ramtier: write-back drained", "slots", slots, "bytes", bytes, "took", time.Since(start))
		return true
	case <-timer.C:
		t.log.Error("ramtier: write-back drain timeout hit; the unflushed acknowledged writes are lost",
			"timeout", t.cfg.DrainTimeout, "slots_left", w.queued.Load(), "dirty_bytes_left", w.dirty.Load())
		return false
	}
}
