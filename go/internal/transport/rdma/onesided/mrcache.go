package onesided

import (
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Transient MRs: caller memory that is not inside a registered pool (RegisterMemory) gets
// an ad-hoc registration for the op instead of a staging copy. Recent registrations are kept
// in a cache bounded in bytes, so a caller that reuses its buffers registers each once.
//
// Why a cached registration is safe: the MR keeps a reference to the registered slice, so
// the Go runtime can neither free that memory nor hand its addresses to another object while
// the entry lives; a later buffer whose range lies inside the entry is the same memory. That
// argument does not hold for memory Go does not own (a C caller's malloc may unmap and remap
// an address behind a pinned registration), so callers of such memory turn the cache off
// (Config.MRCacheBytes < 0): every ad-hoc MR is then deregistered when its op completes.

// mrEntry is one transient registration. refs counts the in-flight ops that use it; an
// entry that leaves the cache (evicted, or uncached from the start) is closed when its last
// op completes.
type mrEntry struct {
	mr     verbs.MR
	refs   int
	cached bool
	used   uint64 // LRU clock
}

type mrCache struct {
	limit   int64 // bytes; <= 0: nothing is kept past its op
	bytes   int64
	clock   uint64
	entries []*mrEntry
	m       *Metrics
}

// find returns a cached entry containing b (and b's offset in it), taking a reference.
func (mc *mrCache) find(b []byte) (*mrEntry, int) {
	a := addrOf(b)
	for _, e := range mc.entries {
		if a >= e.mr.Addr() && a+uint64(len(b)) <= e.mr.Addr()+uint64(e.mr.Len()) {
			mc.clock++
			e.used = mc.clock
			e.refs++
			mc.m.MRCacheHits.Add(1)
			return e, int(a - e.mr.Addr())
		}
	}
	return nil, 0
}

// register makes an ad-hoc MR for b (a reference taken), cached when it fits the budget.
func (mc *mrCache) register(pd verbs.PD, b []byte) (*mrEntry, error) {
	mr, err := pd.RegMR(b, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		mc.m.MRAdhocFailures.Add(1)
		return nil, err
	}
	mc.m.MRAdhocRegs.Add(1)
	mc.clock++
	e := &mrEntry{mr: mr, refs: 1, used: mc.clock}
	n := int64(len(b))
	if mc.limit <= 0 || n > mc.limit {
		return e, nil
	}
	for mc.bytes+n > mc.limit && mc.evictOne() {
	}
	if mc.bytes+n > mc.limit {
		return e, nil
	}
	e.cached = true
	mc.entries = append(mc.entries, e)
	mc.bytes += n
	mc.m.MRCacheBytes.Add(n)
	return e, nil
}

// evictOne drops the least recently used entry from the cache (closed now when idle, else
// by its last op).
func (mc *mrCache) evictOne() bool {
	if len(mc.entries) == 0 {
		return false
	}
	lru := 0
	for i, e := range mc.entries {
		if e.used < mc.entries[lru].used {
			lru = i
		}
	}
	e := mc.entries[lru]
	mc.entries = append(mc.entries[:lru], mc.entries[lru+1:]...)
	n := int64(e.mr.Len())
	mc.bytes -= n
	mc.m.MRCacheBytes.Add(-n)
	mc.m.MRCacheEvictions.Add(1)
	e.cached = false
	if e.refs == 0 {
		e.mr.Close()
	}
	return true
}

// release drops an op's reference; an uncached entry is deregistered with its last one.
func (mc *mrCache) release(e *mrEntry) {
	e.refs--
	if e.refs == 0 && !e.cached {
		e.mr.Close()
		mc.m.MRAdhocReleased.Add(1)
	}
}

// close deregisters everything (the connection is going away; no op is in flight).
func (mc *mrCache) close() {
	for _, e := range mc.entries {
		e.mr.Close()
		mc.m.MRCacheBytes.Add(-int64(e.mr.Len()))
	}
	mc.entries, mc.bytes = nil, 0
}
