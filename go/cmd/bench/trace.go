//go:build linux

package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// traceRequest is one line of a Mooncake-format trace (testdata/traces/README.md): hash_ids
// are prefix blocks, one per 512 tokens; equal ids are the same reusable KV block.
type traceRequest struct {
	Timestamp    int64    `json:"timestamp"` // ms from the start
	InputLength  int64    `json:"input_length"`
	OutputLength int64    `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// maxTraceLine bounds one JSON line (the shipped trace's longest is ~1.7 KiB).
const maxTraceLine = 16 << 20

// slabMaxRef is go/internal/store/slab's maxRef, the cap of its CLOCK reference count.
const slabMaxRef = 3

// loadTrace reads a trace file, plain or gzip-compressed (detected by its magic bytes).
func loadTrace(path string) ([]traceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	reqs, err := readTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

// readTrace parses JSON lines (optionally gzip-compressed). Blank lines are skipped; any
// other malformed line is an error naming its line number.
func readTrace(r io.Reader) ([]traceRequest, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		return readTraceLines(zr)
	}
	return readTraceLines(br)
}

func readTraceLines(r io.Reader) ([]traceRequest, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), maxTraceLine)
	var reqs []traceRequest
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var q traceRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		if err := dec.Decode(&q); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("line %d: trailing data after the JSON object", line)
		}
		if q.Timestamp < 0 {
			return nil, fmt.Errorf("line %d: negative timestamp %d", line, q.Timestamp)
		}
		reqs = append(reqs, q)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, maxTraceLine)
		}
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("no requests")
	}
	return reqs, nil
}

// traceFacts are the request-order facts of a trace that do not depend on a cache.
type traceFacts struct {
	Requests  int
	BlockRefs int64
	Distinct  int64
}

func factsOf(reqs []traceRequest) traceFacts {
	seen := make(map[uint64]struct{})
	f := traceFacts{Requests: len(reqs)}
	for _, q := range reqs {
		f.BlockRefs += int64(len(q.HashIDs))
		for _, h := range q.HashIDs {
			seen[h] = struct{}{}
		}
	}
	f.Distinct = int64(len(seen))
	return f
}

// blockCache is a cache policy over block ids as the replay uses a cache: a request looks
// its blocks up in order and reuses the prefix that hits; the blocks after the first miss
// are recomputed and stored.
type blockCache interface {
	// hit reports whether id is cached and, if so, counts the reuse (recency).
	hit(id uint64) bool
	// store inserts (or refreshes) a recomputed block, evicting as the policy says.
	store(id uint64)
}

// simulate replays reqs over c and returns the prefix hits.
func simulate(reqs []traceRequest, c blockCache) int64 {
	var hits int64
	for _, q := range reqs {
		prefix := true
		for _, h := range q.HashIDs {
			if prefix && c.hit(h) {
				hits++
				continue
			}
			prefix = false
			c.store(h)
		}
	}
	return hits
}

// lruCache is an exact LRU of at most capacity blocks: an intrusive doubly linked list
// over a slice (index 0 is the sentinel), so a full trace simulates without per-op
// allocation.
type lruCache struct {
	capacity int
	idx      map[uint64]int32
	nodes    []lruNode
}

type lruNode struct {
	id         uint64
	prev, next int32
}

func newLRU(capacity int) *lruCache {
	c := &lruCache{capacity: capacity, idx: make(map[uint64]int32, capacity), nodes: make([]lruNode, 1, capacity+1)}
	return c
}

func (c *lruCache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
}

// pushFront makes i the most recently used node.
func (c *lruCache) pushFront(i int32) {
	head := &c.nodes[0]
	c.nodes[i].prev, c.nodes[i].next = 0, head.next
	c.nodes[head.next].prev = i
	head.next = i
}

func (c *lruCache) hit(id uint64) bool {
	i, ok := c.idx[id]
	if ok {
		c.unlink(i)
		c.pushFront(i)
	}
	return ok
}

func (c *lruCache) store(id uint64) {
	if c.hit(id) || c.capacity <= 0 {
		return
	}
	var i int32
	switch {
	case len(c.idx) >= c.capacity: // evict the tail and reuse its node
		i = c.nodes[0].prev
		c.unlink(i)
		delete(c.idx, c.nodes[i].id)
	default:
		c.nodes = append(c.nodes, lruNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i].id = id
	c.idx[id] = i
	c.pushFront(i)
}

// infiniteCache never evicts: its hits are the most any cache can reach on the trace.
type infiniteCache map[uint64]struct{}

func (c infiniteCache) hit(id uint64) bool { _, ok := c[id]; return ok }
func (c infiniteCache) store(id uint64)    { c[id] = struct{}{} }

// lruHits and maxHits are the reference figures the live replay is compared with.
func lruHits(reqs []traceRequest, capacityBlocks int) int64 {
	return simulate(reqs, newLRU(capacityBlocks))
}

func maxHits(reqs []traceRequest) int64 { return simulate(reqs, infiniteCache{}) }

// clockCache models the slab engine's eviction within one size class: slots in a ring, a
// hand that skips referenced slots (taking one reference away) and evicts the first
// unreferenced live one; a hit adds a reference, up to maxRef (the slab's generalized
// CLOCK uses 3; maxRef 1 is a plain reference bit). refOnInsert says whether a stored value
// starts with one reference (the slab before issue 18) or none (the slab now). Like the
// slab, a rewrite of a present block takes a new slot first (a free one, else the hand's
// victim) and only then frees its old slot, which the next insert reuses (the free list
// is last in, first out).
type clockCache struct {
	capacity    int
	maxRef      uint8
	refOnInsert bool
	ids         []uint64
	ref         []uint8
	live        []bool
	free        []int
	idx         map[uint64]int
	hand        int
}

func newClock(capacity int, maxRef uint8, refOnInsert bool) *clockCache {
	return &clockCache{capacity: capacity, maxRef: max(maxRef, 1), refOnInsert: refOnInsert, idx: make(map[uint64]int, capacity)}
}

func (c *clockCache) hit(id uint64) bool {
	i, ok := c.idx[id]
	if ok && c.ref[i] < c.maxRef {
		c.ref[i]++
	}
	return ok
}

func (c *clockCache) store(id uint64) {
	if c.capacity <= 0 {
		return
	}
	old, rewrite := c.idx[id]
	var i int
	switch {
	case len(c.free) > 0:
		i = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	case len(c.ids) < c.capacity:
		i = len(c.ids)
		c.ids, c.ref, c.live = append(c.ids, 0), append(c.ref, 0), append(c.live, false)
	default:
		for !c.live[c.hand] || c.ref[c.hand] > 0 {
			if c.ref[c.hand] > 0 {
				c.ref[c.hand]--
			}
			c.hand = (c.hand + 1) % c.capacity
		}
		i = c.hand
		delete(c.idx, c.ids[i])
		c.hand = (c.hand + 1) % c.capacity
	}
	c.ids[i], c.ref[i], c.live[i] = id, 0, true
	if c.refOnInsert {
		c.ref[i] = 1
	}
	c.idx[id] = i
	if rewrite && old != i {
		c.live[old], c.ref[old] = false, 0
		c.free = append(c.free, old)
	}
}
