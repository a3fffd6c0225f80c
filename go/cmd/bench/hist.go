//go:build linux

package main

import (
	"math"
	"math/bits"
	"time"
)

// hist is a log-linear latency histogram (HDR style): every power-of-two range of
// nanoseconds is split into subBuckets equal buckets, so a recorded value is known to within
// 1/subBuckets (< 0.8%) of itself. Recording never allocates; workers keep their own
// histogram and merge them at the end.
type hist struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64 // nanoseconds
	min    int64
	max    int64
}

const (
	subBits     = 7
	subBuckets  = 1 << subBits // per power of two
	histPowers  = 64 - subBits
	histBuckets = (histPowers + 1) * subBuckets
)

// bucketOf returns the bucket index of v nanoseconds (v < 0 counts as 0).
func bucketOf(v int64) int {
	if v < subBuckets {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	// The top subBits+1 significant bits select the bucket: exponent and sub-bucket.
	e := bits.Len64(uint64(v)) - subBits - 1 // shift that leaves subBits+1 significant bits
	sub := int(uint64(v)>>uint(e)) - subBuckets
	return (e+1)*subBuckets + sub
}

// bucketHigh returns the largest value mapped to bucket b (the reported percentile value, so
// a percentile is never under-stated).
func bucketHigh(b int) int64 {
	if b < subBuckets {
		return int64(b)
	}
	e := b/subBuckets - 1
	sub := b % subBuckets
	lo := uint64(subBuckets+sub) << uint(e)
	hi := lo + (uint64(1) << uint(e)) - 1
	if hi > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(hi)
}

func (h *hist) record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

func (h *hist) merge(o *hist) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) in nanoseconds: the smallest
// recorded value v such that at least ceil(p*n) samples are <= v, up to the bucket
// resolution and clamped to the exact recorded [min, max]. 0 for an empty histogram.
func (h *hist) percentile(p float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(p * float64(h.n)))
	rank = max(1, min(rank, h.n))
	var cum uint64
	for b, c := range h.counts {
		cum += c
		if cum >= rank {
			return max(h.min, min(bucketHigh(b), h.max))
		}
	}
	return h.max
}

func (h *hist) mean() int64 {
	if h.n == 0 {
		return 0
	}
	return int64(h.sum / float64(h.n))
}

// exactPercentile is the nearest-rank p-quantile of sorted samples (the reference the
// histogram is tested against).
func exactPercentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}
