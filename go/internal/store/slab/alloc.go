//go:build linux

package slab

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// reserve finds a free slot of class ci, evicting as needed: first down to the low
// watermark when the high one would be crossed (only when High < 1; the default evicts
// on demand), then, when the class has no free slot and no extent is unassigned, either
// the class's next CLOCK victim (a value not read since the hand last passed it) or a
// whole cold extent of another class, which is drained and reassigned. It fails with
// ErrCacheFull only when nothing can be evicted and pinned slots do not drain in time.
//
// Watermark victims evicted on the way are returned instead of retired, so that the Put
// can make their tombstones durable in the same table fsync as its own record (the
// caller must retire or commit them on every path).
//
// With noWait it returns errWouldWait instead of waiting for a release (a batch whose own
// reservations may be what the class waits for commits them first).
//
// The bool reports a taken CLOCK victim (see reclaimLocked): its old record is still live
// in the table, and the caller overwrites it before anything else.
func (e *Engine) reserve(ci int, victimBuf []*slot, noWait bool) (*slot, []*slot, bool, error) {
	cs := e.classes[ci].size
	var deadline time.Time
	for {
		e.allocMu.Lock()
		if e.closed.Load() {
			e.allocMu.Unlock()
			return nil, nil, false, store.ErrClosed
		}
		victims := victimBuf[:0]
		if e.cfg.HighWatermark < 1 && e.used+cs > e.high {
			victims = e.evictGlobalLocked(e.used+cs-e.low, victims)
		}
		s := e.popFreeLocked(ci)
		if s == nil && e.takeExtentLocked(ci) {
			s = e.popFreeLocked(ci)
		}
		if s != nil {
			e.reserveLocked(ci, s, cs)
			e.allocMu.Unlock()
			return s, victims, false, nil
		}
		more, taken := e.reclaimLocked(ci)
		if taken != nil {
			// The CLOCK victim is this Put's slot at once: see reclaimLocked.
			e.classes[ci].pending--
			taken.key = store.Key{}
			e.reserveLocked(ci, taken, cs)
			e.allocMu.Unlock()
			return taken, victims, true, nil
		}
		victims = append(victims, more...)
		if len(victims) == 0 && len(e.pool) > 0 {
			e.allocMu.Unlock() // an empty extent went straight back to the pool
			continue
		}
		// Dead slots, draining extents and in-flight Puts of this class will all yield
		// something to evict or reuse soon.
		waitable := e.classes[ci].pending > 0 || e.classes[ci].reserved > 0 || e.draining > 0
		wake := e.releaseCh
		if len(victims) == 0 && waitable {
			e.waiters++
		}
		e.allocMu.Unlock()
		if len(victims) > 0 {
			_ = e.retire(victims) // unpinned victims are free when this returns
			continue
		}
		if !waitable {
			return nil, nil, false, fmt.Errorf("no evictable slot for class %d (%d bytes): %w", ci, cs, store.ErrCacheFull)
		}
		if noWait {
			e.allocMu.Lock()
			e.waiters--
			e.allocMu.Unlock()
			return nil, nil, false, errWouldWait
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(reclaimWait)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			e.allocMu.Lock()
			e.waiters--
			e.allocMu.Unlock()
			return nil, nil, false, fmt.Errorf("pinned slots did not drain within %v: %w", reclaimWait, store.ErrCacheFull)
		}
		t := time.NewTimer(wait)
		select {
		case <-wake:
		case <-t.C:
		}
		t.Stop()
		e.allocMu.Lock()
		e.waiters--
		e.allocMu.Unlock()
	}
}

// killLocked marks a slot that left (or never entered) the index as dead.
func (e *Engine) killLocked(s *slot, countObject bool) {
	if s.state == slotReserved {
		e.classes[s.ext.class].reserved--
		s.ext.reserved--
		e.notifyLocked()
	}
	s.state = slotDead
	e.used -= s.ext.slotSize
	e.classes[s.ext.class].pending++
	if countObject {
		e.objects--
	}
}

// evictLocked removes a live slot from the index and kills it; the caller retires it.
func (e *Engine) evictLocked(s *slot) {
	sh := e.shardOf(s.key)
	sh.mu.Lock()
	if sh.m[s.key] == s {
		delete(sh.m, s.key)
	}
	sh.mu.Unlock()
	e.killLocked(s, true)
	e.observeLocked(s.key, int64(s.length), store.Evicted)
	e.nEvictions.Add(1)
	e.nEvictedBytes.Add(s.ext.slotSize)
}

func (e *Engine) quarantine(s *slot) {
	e.allocMu.Lock()
	defer e.allocMu.Unlock()
	if s.state != slotDead {
		return
	}
	s.state = slotQuarantined
	e.classes[s.ext.class].pending--
	if s.ext.draining && !s.ext.stuck {
		s.ext.stuck = true
		e.draining--
	}
	e.notifyLocked()
	e.log.Error("slab: slot quarantined after a failed tombstone", "extent", s.ext.idx, "slot", s.idx)
}

// tryRelease frees a dead slot once its tombstone is durable and no reader pins it. Both
// the retiring writer and the last reader call it; the CAS makes exactly one succeed.
func (e *Engine) tryRelease(s *slot) {
	if !s.tombDone.Load() || s.pins.Load() != 0 || !s.released.CompareAndSwap(false, true) {
		return
	}
	e.allocMu.Lock()
	ext := s.ext
	c := &e.classes[ext.class]
	s.state = slotFree
	s.key = store.Key{}
	c.pending--
	ext.used--
	recycle := false
	if ext.draining {
		recycle = ext.used == 0
	} else {
		ext.free = append(ext.free, s.idx)
		if !ext.inAvail {
			ext.inAvail = true
			c.avail = append(c.avail, ext)
		}
	}
	e.notifyLocked()
	e.allocMu.Unlock()
	if recycle {
		e.recycleExtent(ext)
	}
}

// recycleExtent returns an emptied extent to the pool. Its table region holds only
// tombstones, which are punched out to keep slots.tbl sparse (best effort: stale
// tombstones are harmless at rebuild).
func (e *Engine) recycleExtent(ext *extent) {
	_ = e.tbl.PunchHole(int64(ext.idx)*e.maxSlots*recordSize, e.maxSlots*recordSize)
	e.allocMu.Lock()
	defer e.allocMu.Unlock()
	e.toPoolLocked(ext)
	e.notifyLocked()
}

// toPoolLocked unassigns an empty draining extent.
func (e *Engine) toPoolLocked(ext *extent) {
	c := &e.classes[ext.class]
	c.extents = slices.DeleteFunc(c.extents, func(x *extent) bool { return x == ext })
	c.avail = slices.DeleteFunc(c.avail, func(x *extent) bool { return x == ext })
	if c.handExt >= len(c.extents) {
		c.handExt, c.handSlot = 0, 0
	}
	ext.class, ext.slotSize, ext.slots, ext.free = -1, 0, nil, nil
	ext.draining, ext.inAvail, ext.stuck = false, false, false
	e.draining--
	e.pool = append(e.pool, ext)
}

func (e *Engine) popFreeLocked(ci int) *slot {
	c := &e.classes[ci]
	for len(c.avail) > 0 {
		ext := c.avail[len(c.avail)-1]
		if ext.class != ci { // cannot happen: toPoolLocked unlists extents
			c.avail = c.avail[:len(c.avail)-1]
			continue
		}
		if ext.draining || len(ext.free) == 0 {
			ext.inAvail = false
			c.avail = c.avail[:len(c.avail)-1]
			continue
		}
		i := ext.free[len(ext.free)-1]
		ext.free = ext.free[:len(ext.free)-1]
		ext.used++
		return &ext.slots[i]
	}
	return nil
}

// takeExtentLocked assigns an unassigned extent to class ci.
func (e *Engine) takeExtentLocked(ci int) bool {
	if len(e.pool) == 0 {
		return false
	}
	ext := e.pool[len(e.pool)-1]
	e.pool = e.pool[:len(e.pool)-1]
	e.assignLocked(ext, ci)
	for i := len(ext.slots) - 1; i >= 0; i-- {
		ext.free = append(ext.free, int32(i))
	}
	ext.inAvail = true
	e.classes[ci].avail = append(e.classes[ci].avail, ext)
	return true
}

// assignLocked carves ext into slots of class ci (all free, not yet on the free list).
func (e *Engine) assignLocked(ext *extent, ci int) {
	c := &e.classes[ci]
	n := e.cfg.ExtentBytes / c.size
	ext.class, ext.slotSize = ci, c.size
	ext.slots = make([]slot, n)
	ext.free = make([]int32, 0, n)
	for i := range ext.slots {
		ext.slots[i].ext, ext.slots[i].idx = ext, int32(i)
	}
	ext.lastAccess.Store(e.tick.Add(1))
	c.extents = append(c.extents, ext)
}

// evictGlobalLocked runs the global CLOCK over all extents until need bytes are evicted
// or two sweeps found nothing more. Pinned and recently referenced values are skipped.
func (e *Engine) evictGlobalLocked(need int64, victims []*slot) []*slot {
	e.leases.Prune() // expired leases stop protecting their slots before the scan
	total := 0
	for _, ext := range e.extents {
		total += len(ext.slots)
	}
	for steps := 0; need > 0 && steps < 2*total+len(e.extents); steps++ {
		if e.handExt >= len(e.extents) {
			e.handExt, e.handSlot = 0, 0
		}
		ext := e.extents[e.handExt]
		if ext.draining || e.handSlot >= len(ext.slots) {
			e.handExt, e.handSlot = e.handExt+1, 0
			continue
		}
		s := &ext.slots[e.handSlot]
		e.handSlot++
		if s.state != slotLive || s.pins.Load() > 0 || s.leased.Load() || s.passed() {
			continue
		}
		e.evictLocked(s)
		victims = append(victims, s)
		need -= ext.slotSize
	}
	return victims
}

// reclaimLocked frees room for class ci when it has no free slot and the pool is empty:
// it steals the coldest extent of another class when that is colder than anything in ci
// (the size mix shifted), else evicts ci's CLOCK victim.
//
// A CLOCK victim that no reader pins once it is out of the index (none can pin it later) is
// returned as taken instead, for the caller to reuse at once without a tombstone: the
// caller's record goes to the same table address and replaces the victim's record, in the
// caller's own group commit. Until that commit a crash can leave the victim's record over
// the caller's payload (or a torn one): the read CRC makes that a miss, as for a record
// durable before its payload (see overlapped). So a full cache's PUT pays no victim commit.
func (e *Engine) reclaimLocked(ci int) (victims []*slot, taken *slot) {
	c := &e.classes[ci]
	e.leases.Prune()
	var steal *extent
	stealPinned := true
	for _, ext := range e.extents {
		// An extent with an in-flight Put would be refilled behind the drain's back.
		// A leased value must survive until it is read, so its extent is not drained.
		if ext.class < 0 || ext.class == ci || ext.draining || ext.reserved > 0 || ext.leases.Load() > 0 {
			continue
		}
		pinned := ext.pins.Load() > 0
		// Prefer unpinned extents: a pinned one cannot empty until its readers finish.
		if steal == nil || (stealPinned && !pinned) ||
			(pinned == stealPinned && ext.lastAccess.Load() < steal.lastAccess.Load()) {
			steal, stealPinned = ext, pinned
		}
	}
	own := int64(math.MaxInt64)
	for _, ext := range c.extents {
		if !ext.draining {
			own = min(own, ext.lastAccess.Load())
		}
	}
	if steal != nil && (own == math.MaxInt64 || steal.lastAccess.Load() < own) {
		return e.drainLocked(steal), nil
	}
	// The first CLOCK victim is normally taken (above). One a reader still pins must wait
	// for its reader and its tombstone before reuse; then victims are evicted a few at a
	// time, so that one tombstone commit leaves free slots for the PUTs that follow.
	for range e.reclaimBatch(c.size) {
		s := e.clockVictimLocked(ci)
		if s == nil {
			break
		}
		e.evictLocked(s)
		if len(victims) == 0 && s.pins.Load() == 0 {
			return nil, s
		}
		victims = append(victims, s)
	}
	if len(victims) > 0 {
		return victims, nil
	}
	if steal != nil {
		return e.drainLocked(steal), nil
	}
	return nil, nil
}

// errWouldWait: reserve would have to wait for a release (see reserve's noWait).
var errWouldWait = errors.New("slab: reservation would wait")

// reclaimBatch is how many CLOCK victims one reclaim evicts in a class of slot size cs:
// up to 8, at most 16 MiB and 1/1024 of the capacity of slots (at least one). Evicting ahead
// decides early and leaves slots empty, which a small cache feels: on the FAST'25 trace a
// 119 MiB node evicting 8 × 64 KiB at a time hit 0.983× LRU instead of 0.989×.
func (e *Engine) reclaimBatch(cs int64) int {
	return int(min(8, max(1, min(16<<20, e.cfg.CapacityBytes/1024)/cs)))
}

// drainLocked empties an extent for reassignment: every live value is evicted and free
// slots are withdrawn. An already empty extent goes straight back to the pool.
func (e *Engine) drainLocked(ext *extent) []*slot {
	ext.draining = true
	e.draining++
	ext.free = ext.free[:0]
	var victims []*slot
	for i := range ext.slots {
		if s := &ext.slots[i]; s.state == slotLive {
			e.evictLocked(s)
			victims = append(victims, s)
		}
	}
	if ext.used == 0 {
		e.toPoolLocked(ext)
	}
	return victims
}

// clockVictimLocked returns the next unpinned, unreferenced live slot of class ci.
func (e *Engine) clockVictimLocked(ci int) *slot {
	c := &e.classes[ci]
	total := 0
	for _, ext := range c.extents {
		total += len(ext.slots)
	}
	for steps := 0; steps < 2*total+len(c.extents); steps++ {
		if c.handExt >= len(c.extents) {
			c.handExt, c.handSlot = 0, 0
		}
		ext := c.extents[c.handExt]
		if ext.draining || c.handSlot >= len(ext.slots) {
			c.handExt, c.handSlot = c.handExt+1, 0
			continue
		}
		s := &ext.slots[c.handSlot]
		c.handSlot++
		if s.state != slotLive || s.pins.Load() > 0 || s.leased.Load() || s.passed() {
			continue
		}
		return s
	}
	return nil
}

// reserveLocked marks s, a free or just-taken slot of class ci, reserved for a Put of cs
// bytes of capacity. Caller holds allocMu.
func (e *Engine) reserveLocked(ci int, s *slot, cs int64) {
	e.classes[ci].reserved++
	s.ext.reserved++
	s.state = slotReserved
	s.tombDone.Store(false)
	s.released.Store(false)
	e.used += cs
}
