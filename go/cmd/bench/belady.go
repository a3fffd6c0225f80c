//go:build linux

package main

import (
	"container/heap"
	"math"
)

// beladyCache is Belady's offline optimum (MIN) over the trace it was built from: when a
// block must go, the one whose next reference lies farthest in the future goes, and a
// block whose next reference is farther than every cached block's is not stored at all.
// It knows the future, so no online policy passes it on this trace; it is the ceiling the
// live hit ratio and LRU are drawn against (tools/bench report).
//
// It must be fed the trace it was built from, in order (simulate does): every block
// reference is either a hit that returned true or a store, and that advances the cursor.
type beladyCache struct {
	capacity int
	next     []int32 // next[p]: position of the next reference of the block referenced at p
	pos      int
	cached   map[uint64]int32 // cached block -> its next reference
	farthest beladyHeap       // max-heap on next reference; stale entries are skipped
}

// beladyNever is the next reference of a block that is not referenced again.
const beladyNever = math.MaxInt32

func newBelady(reqs []traceRequest, capacity int) *beladyCache {
	var n int
	for _, q := range reqs {
		n += len(q.HashIDs)
	}
	next := make([]int32, n)
	last := make(map[uint64]int32)
	p := int32(n)
	for i := len(reqs) - 1; i >= 0; i-- {
		ids := reqs[i].HashIDs
		for j := len(ids) - 1; j >= 0; j-- {
			p--
			if q, ok := last[ids[j]]; ok {
				next[p] = q
			} else {
				next[p] = beladyNever
			}
			last[ids[j]] = p
		}
	}
	return &beladyCache{capacity: capacity, next: next, cached: make(map[uint64]int32, capacity)}
}

// advance consumes the current reference and returns its block's next reference.
func (c *beladyCache) advance() int32 {
	if c.pos >= len(c.next) { // fed more references than its trace holds
		return beladyNever
	}
	nu := c.next[c.pos]
	c.pos++
	return nu
}

func (c *beladyCache) hit(id uint64) bool {
	if _, ok := c.cached[id]; !ok {
		return false // the store of this same reference follows
	}
	c.set(id, c.advance())
	return true
}

func (c *beladyCache) store(id uint64) {
	nu := c.advance()
	if _, ok := c.cached[id]; ok {
		c.set(id, nu)
		return
	}
	if c.capacity <= 0 || nu == beladyNever {
		return
	}
	if len(c.cached) >= c.capacity {
		victim, vnext := c.peekFarthest()
		if vnext <= nu {
			return // everything cached is needed sooner than this block
		}
		heap.Pop(&c.farthest)
		delete(c.cached, victim)
	}
	c.set(id, nu)
}

func (c *beladyCache) set(id uint64, nu int32) {
	c.cached[id] = nu
	heap.Push(&c.farthest, beladyEntry{id: id, next: nu})
}

// peekFarthest drops stale heap entries and returns the cached block needed last.
func (c *beladyCache) peekFarthest() (uint64, int32) {
	for {
		e := c.farthest[0]
		if nu, ok := c.cached[e.id]; ok && nu == e.next {
			return e.id, e.next
		}
		heap.Pop(&c.farthest)
	}
}

type beladyEntry struct {
	id   uint64
	next int32
}

type beladyHeap []beladyEntry

func (h beladyHeap) Len() int           { return len(h) }
func (h beladyHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h beladyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *beladyHeap) Push(x any)        { *h = append(*h, x.(beladyEntry)) }
func (h *beladyHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// beladyHits is the offline optimum's prefix hits at capacityBlocks.
func beladyHits(reqs []traceRequest, capacityBlocks int) int64 {
	return simulate(reqs, newBelady(reqs, capacityBlocks))
}
