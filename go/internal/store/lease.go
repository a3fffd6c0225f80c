package store

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLeaseShare is the share of an engine's capacity that leases may protect at once.
// Past it a lookup still answers, without a lease, so probes can never wedge eviction.
const DefaultLeaseShare = 0.25

// Leaser engines protect a value from capacity eviction between a lookup and the read it
// announces: a leased value is skipped by eviction until it is read (Get or ReadInto),
// removed, replaced, or the lease expires. Explicit removal always wins over a lease.
type Leaser interface {
	// Lease returns the stored length of key's value and whether a lease was granted
	// (false when the lease budget is spent: the value is present but unprotected).
	// Leasing a leased value extends its lease. An absent value is ErrNotFound.
	Lease(key Key, ttl time.Duration) (size int64, leased bool, err error)
	// ReleaseLease ends key's lease, if any: a tier in front of the engine served the read.
	ReleaseLease(key Key)
	// LeaseStats reports the lease table's counters.
	LeaseStats() LeaseStats
}

// LeaseStats are the counters and gauges of a lease table.
type LeaseStats struct {
	Active      int64 // leases held now (expired ones not yet noticed included)
	ActiveBytes int64 // capacity they protect
	LimitBytes  int64
	Granted     int64
	Refused     int64 // lookups answered without a lease: the budget was spent
	Expired     int64
	Released    int64 // ended by a read, a removal or a replacement
}

// Add accumulates o into s (for multi-disk groups).
func (s *LeaseStats) Add(o LeaseStats) {
	s.Active += o.Active
	s.ActiveBytes += o.ActiveBytes
	s.LimitBytes += o.LimitBytes
	s.Granted += o.Granted
	s.Refused += o.Refused
	s.Expired += o.Expired
	s.Released += o.Released
}

// Leases is a bounded lease table that engines embed: Grant records a lease charged with
// the capacity it protects, Held answers eviction's question, and Release ends a lease
// early. Expired leases are dropped lazily, on the next Grant, Prune or Held of that key.
// The callback given to NewLeases runs whenever a tag starts (held=true) or stops holding
// a lease, so that an engine can keep lock-free per-slot flags for its eviction scans.
// Safe for concurrent use; the callback runs with the table's lock held and must be quick
// and must not call back into the table.
type Leases struct {
	limit    int64
	onChange func(tag any, held bool)
	now      func() time.Time

	mu    sync.Mutex
	bytes int64
	m     map[Key]*leaseEnt
	h     leaseHeap
	n     atomic.Int64 // len(m), read without the lock on the hot paths

	granted, refused, expired, released atomic.Int64
}

type leaseEnt struct {
	key   Key
	until int64 // unix nanoseconds
	size  int64
	tag   any
	idx   int // heap index
}

// NewLeases returns a table protecting at most limit bytes at once. onChange (may be nil)
// is told when a tag starts and stops holding a lease.
func NewLeases(limit int64, onChange func(tag any, held bool)) *Leases {
	return &Leases{limit: limit, onChange: onChange, now: time.Now, m: map[Key]*leaseEnt{}}
}

// SetClock replaces the time source (tests force expiry with it).
func (l *Leases) SetClock(now func() time.Time) {
	l.mu.Lock()
	l.now = now
	l.mu.Unlock()
}

// Grant leases key (charged size bytes of capacity) for ttl and reports whether it did. An
// existing lease of key is extended (and re-tagged) without a second charge.
func (l *Leases) Grant(key Key, size int64, ttl time.Duration, tag any) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now().UnixNano()
	l.pruneLocked(now)
	until := now + int64(ttl)
	if e := l.m[key]; e != nil {
		if e.tag != tag {
			l.change(e.tag, false)
			e.tag = tag
			l.change(tag, true)
			l.bytes += size - e.size
			e.size = size
		}
		e.until = max(e.until, until)
		heap.Fix(&l.h, e.idx)
		l.granted.Add(1)
		return true
	}
	if l.bytes+size > l.limit {
		l.refused.Add(1)
		return false
	}
	e := &leaseEnt{key: key, until: until, size: size, tag: tag}
	heap.Push(&l.h, e)
	l.m[key] = e
	l.bytes += size
	l.n.Store(int64(len(l.m)))
	l.change(tag, true)
	l.granted.Add(1)
	return true
}

// Held reports whether key holds an unexpired lease.
func (l *Leases) Held(key Key) bool {
	if l.n.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[key]
	if e == nil {
		return false
	}
	if e.until <= l.now().UnixNano() {
		l.removeLocked(e)
		l.expired.Add(1)
		return false
	}
	return true
}

// Release ends key's lease, if any (a read consumed it, or the value left the engine).
func (l *Leases) Release(key Key) {
	if l.n.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[key]; e != nil {
		l.removeLocked(e)
		l.released.Add(1)
	}
}

// Prune drops every expired lease now.
func (l *Leases) Prune() {
	if l.n.Load() == 0 {
		return
	}
	l.mu.Lock()
	l.pruneLocked(l.now().UnixNano())
	l.mu.Unlock()
}

// Stats returns the table's counters.
func (l *Leases) Stats() LeaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LeaseStats{
		Active: int64(len(l.m)), ActiveBytes: l.bytes, LimitBytes: l.limit,
		Granted: l.granted.Load(), Refused: l.refused.Load(), Expired: l.expired.Load(), Released: l.released.Load(),
	}
}

func (l *Leases) pruneLocked(now int64) {
	for len(l.h) > 0 && l.h[0].until <= now {
		l.removeLocked(l.h[0])
		l.expired.Add(1)
	}
}

func (l *Leases) removeLocked(e *leaseEnt) {
	heap.Remove(&l.h, e.idx)
	delete(l.m, e.key)
	l.bytes -= e.size
	l.n.Store(int64(len(l.m)))
	l.change(e.tag, false)
}

func (l *Leases) change(tag any, held bool) {
	if l.onChange != nil && tag != nil {
		l.onChange(tag, held)
	}
}

// leaseHeap orders leases by expiry.
type leaseHeap []*leaseEnt

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].until < h[j].until }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *leaseHeap) Push(x any) {
	e := x.(*leaseEnt)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *leaseHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// Lease leases key through the first Leaser in e's wrapper chain; without one it answers
// the lookup with Stat and no lease.
func Lease(e Engine, key Key, ttl time.Duration) (int64, bool, error) {
	if l, ok := Find[Leaser](e); ok {
		return l.Lease(key, ttl)
	}
	n, err := e.Stat(key)
	return n, false, err
}
