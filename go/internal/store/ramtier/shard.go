package ramtier

import (
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// reserve allocates a pinned slot of n bytes (a multiple of 4096) for key, retiring tail
// slots as needed. When the tail is pinned or still being filled it waits for a pin to
// drop, at most WaitTimeout, then fails with errNoRoom.
func (sh *shard) reserve(key store.Key, n int64) (*slot, error) {
	t := sh.t
	if n > sh.size {
		return nil, errNoRoom
	}
	var deadline time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		sh.mu.Lock()
		if s := sh.allocLocked(n); s != nil {
			s.key, s.state, s.length = key, slotReserved, 0
			s.pins.Store(1)
			sh.mu.Unlock()
			t.backlog.Add(1)
			return s, nil
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(t.cfg.WaitTimeout)
			t.waits.Add(1)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			sh.mu.Unlock()
			return nil, errNoRoom
		}
		wake := sh.wake
		sh.waiters.Add(1)
		sh.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-wake:
		case <-timer.C:
		}
		sh.waiters.Add(-1)
	}
}

// allocLocked carves n bytes at the ring head, retiring tail slots that are unpinned and
// durable (live) or dead. It returns nil when the tail blocks.
func (sh *shard) allocLocked(n int64) *slot {
	for {
		if off, ok := sh.fitLocked(n); ok {
			s := sh.newSlotLocked()
			s.off, s.n = sh.base+off, n
			sh.ring[(sh.rhead+sh.rlen)%len(sh.ring)] = s
			sh.rlen++
			sh.used += n
			return s
		}
		if sh.rlen == 0 {
			return nil // n > size: cannot happen, reserve checks it
		}
		tail := sh.ring[sh.rhead]
		if tail.state == slotReserved || tail.state == slotDirty || tail.pins.Load() > 0 {
			return nil
		}
		sh.retireTailLocked()
	}
}

// fitLocked finds room for n bytes after the head (relative offset).
func (sh *shard) fitLocked(n int64) (int64, bool) {
	if sh.rlen == 0 {
		return 0, n <= sh.size
	}
	if sh.rlen == len(sh.ring) {
		return 0, false
	}
	tail := sh.ring[sh.rhead].off - sh.base
	back := sh.ring[(sh.rhead+sh.rlen-1)%len(sh.ring)]
	head := back.off - sh.base + back.n
	if head > tail { // not wrapped: free space is [head, size) and [0, tail)
		if head+n <= sh.size {
			return head, true
		}
		if n <= tail {
			return 0, true // wrap; [head, size) stays unused until the tail passes it
		}
		return 0, false
	}
	// wrapped: free space is [head, tail)
	if head+n <= tail {
		return head, true
	}
	return 0, false
}

// retireTailLocked drops the tail slot (unpinned, live or dead) and recycles it.
func (sh *shard) retireTailLocked() {
	s := sh.ring[sh.rhead]
	sh.ring[sh.rhead] = nil
	sh.rhead = (sh.rhead + 1) % len(sh.ring)
	sh.rlen--
	sh.used -= s.n
	if s.state == slotLive {
		if sh.index[s.key] == s {
			delete(sh.index, s.key)
		}
		sh.live -= int64(s.length)
		sh.objects--
		sh.t.evictions.Add(1)
		sh.t.evictedBytes.Add(s.n)
	}
	*s = slot{}
	sh.spare = append(sh.spare, s)
}

func (sh *shard) newSlotLocked() *slot {
	if k := len(sh.spare); k > 0 {
		s := sh.spare[k-1]
		sh.spare = sh.spare[:k-1]
		s.sh = sh
		return s
	}
	return &slot{sh: sh}
}

// publish makes a filled, still pinned slot live in the index if ok() holds (checked under
// the shard lock), replacing any older copy of the key. Otherwise the slot is retired.
func (sh *shard) publish(s *slot, ok func() bool) bool {
	sh.mu.Lock()
	old := sh.index[s.key]
	published := ok() && (old == nil || old.state != slotDirty) // RAM's newest value is never replaced by the disk's
	if published {
		if old != nil {
			sh.killLocked(old)
		}
		sh.index[s.key] = s
		s.state = slotLive
		sh.live += int64(s.length)
		sh.objects++
	} else {
		s.state = slotDead
	}
	sh.wakeLocked()
	sh.mu.Unlock()
	sh.t.backlog.Add(-1)
	return published
}

// abort retires a reserved slot whose fill or disk I/O failed.
func (sh *shard) abort(s *slot) {
	sh.mu.Lock()
	s.state = slotDead
	sh.wakeLocked()
	sh.mu.Unlock()
	sh.t.backlog.Add(-1)
}

// invalidate drops key's RAM copy (readers that pinned it finish undisturbed). It reports
// whether the copy dropped was dirty (write-back, not yet on disk).
func (sh *shard) invalidate(key store.Key) (dirty bool) {
	sh.mu.Lock()
	if s := sh.index[key]; s != nil {
		dirty = s.state == slotDirty
		sh.killLocked(s)
	}
	sh.mu.Unlock()
	return dirty
}

// invalidateDurable drops key's RAM copy unless it is dirty: a removal on disk concerns
// an older version than a dirty slot holds.
func (sh *shard) invalidateDurable(key store.Key) {
	sh.mu.Lock()
	if s := sh.index[key]; s != nil && s.state != slotDirty {
		sh.killLocked(s)
	}
	sh.mu.Unlock()
}

// publishDirty makes a filled, pinned write-back slot key's value in the index, replacing
// any older copy (an older dirty slot is then dropped by its flusher, unwritten).
func (sh *shard) publishDirty(s *slot) {
	sh.mu.Lock()
	if old := sh.index[s.key]; old != nil {
		sh.killLocked(old)
	}
	sh.index[s.key] = s
	s.state = slotDirty
	sh.live += int64(s.length)
	sh.objects++
	sh.wakeLocked()
	sh.mu.Unlock()
	sh.t.backlog.Add(-1)
}

func (sh *shard) killLocked(s *slot) {
	delete(sh.index, s.key)
	s.state = slotDead
	sh.live -= int64(s.length)
	sh.objects--
}

func (sh *shard) wakeLocked() {
	if sh.waiters.Load() > 0 {
		close(sh.wake)
		sh.wake = make(chan struct{})
	}
}

// unpin drops one pin; the last one may unblock an allocation waiting on the tail.
func (t *Tier) unpin(s *slot) {
	sh := s.sh
	if s.pins.Add(-1) == 0 && sh.waiters.Load() > 0 {
		sh.mu.Lock()
		sh.wakeLocked()
		sh.mu.Unlock()
	}
}
