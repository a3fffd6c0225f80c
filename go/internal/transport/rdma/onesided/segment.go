package onesided

import (
	"fmt"
	"sort"
	"sync"
)

// segment hands out leases (depth x slot bytes, 4 KiB aligned) from one registered region,
// first fit, merging freed extents.
type segment struct {
	mu   sync.Mutex
	size uint64
	free []extent // sorted by off, non-adjacent
}

type extent struct{ off, len uint64 }

func newSegment(size uint64) *segment {
	return &segment{size: size, free: []extent{{0, size}}}
}

func (s *segment) alloc(n uint64) (uint64, error) {
	n = (n + 4095) &^ 4095
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range s.free {
		if e.len >= n {
			off := e.off
			if e.len == n {
				s.free = append(s.free[:i], s.free[i+1:]...)
			} else {
				s.free[i] = extent{e.off + n, e.len - n}
			}
			return off, nil
		}
	}
	return 0, fmt.Errorf("onesided: receive segment exhausted: no %d free bytes (%d free of %d)", n, s.freeLocked(), s.size)
}

func (s *segment) release(off, n uint64) {
	n = (n + 4095) &^ 4095
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, extent{off, n})
	sort.Slice(s.free, func(i, j int) bool { return s.free[i].off < s.free[j].off })
	merged := s.free[:1]
	for _, e := range s.free[1:] {
		last := &merged[len(merged)-1]
		if last.off+last.len == e.off {
			last.len += e.len
		} else {
			merged = append(merged, e)
		}
	}
	s.free = merged
}

func (s *segment) freeBytes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freeLocked()
}

func (s *segment) freeLocked() uint64 {
	var t uint64
	for _, e := range s.free {
		t += e.len
	}
	return t
}
