package ring

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// PointsPerWeight is the number of placement-ring points a node of weight 1 receives by
// default. Each SHA-256 digest yields four 64-bit points, so a weight-1 node costs 256
// digests. 1,024 points keep every node's key share within a few percent of its weight's
// share; with 160 points (LegacyPointsPerWeight) three equal nodes split the keys of a real
// trace 31.9/36.5/31.6%, and the overloaded node's evictions cost the whole cluster hits.
const PointsPerWeight = 1024

// LegacyPointsPerWeight is the density of the first releases' placement ring and of the
// intra-node disk ring (whose placement is on disk and must not move). Clients that must
// route like an older client during a rolling upgrade select it with WithPointsPerWeight.
const LegacyPointsPerWeight = 160

// MaxPointsPerWeight bounds WithPointsPerWeight.
const MaxPointsPerWeight = 4096

// MaxWeight bounds a node's weight so that a bad configuration cannot allocate a huge ring:
// weights are relative, and 100 × 1,024 points already cost 1.6 MB per node.
const MaxWeight = 100

// Option configures New.
type Option func(*config)

type config struct{ pointsPerWeight int }

// WithPointsPerWeight sets the ring's density: a multiple of 4 in 4..MaxPointsPerWeight, or 0
// for the default (PointsPerWeight), so callers can pass a configured value through as is.
// Every client of a cluster must use the same density, or they route keys differently
// (a misrouted read is a miss, never wrong bytes).
func WithPointsPerWeight(n int) Option { return func(c *config) { c.pointsPerWeight = n } }

// Node is one ring member.
type Node struct {
	ID     string
	Weight uint32
}

// Ring is immutable once built and safe for concurrent use. Points are kept as two
// parallel arrays (12 bytes a point instead of a padded 16-byte struct): at 1,000 nodes of
// 1,024 points that is 11.7 MiB.
type Ring struct {
	nodes           []Node
	hashes          []uint64 // ascending (ties: smaller node index first)
	owners          []int32  // owners[i] indexes nodes: the node point i belongs to
	pointsPerWeight int
}

// parallelPoints: rings with more points than this hash their nodes on several goroutines.
const parallelPoints = 1 << 16

// New builds a ring. Node ids must be unique and non-empty; weights must be 1..MaxWeight.
func New(nodes []Node, opts ...Option) (*Ring, error) {
	cfg := config{pointsPerWeight: PointsPerWeight}
	for _, o := range opts {
		o(&cfg)
	}
	ppw := cmp.Or(cfg.pointsPerWeight, PointsPerWeight)
	if ppw < 4 || ppw > MaxPointsPerWeight || ppw%4 != 0 {
		return nil, fmt.Errorf("ring: %d points per weight: want a multiple of 4 in 4..%d", ppw, MaxPointsPerWeight)
	}
	r := &Ring{nodes: append([]Node(nil), nodes...), pointsPerWeight: ppw}
	slices.SortFunc(r.nodes, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	offsets := make([]int, len(r.nodes)+1) // node i's points go to [offsets[i], offsets[i+1])
	for i, n := range r.nodes {
		if n.ID == "" {
			return nil, errors.New("ring: empty node id")
		}
		if i > 0 && r.nodes[i-1].ID == n.ID {
			return nil, fmt.Errorf("ring: duplicate node id %q", n.ID)
		}
		if n.Weight < 1 || n.Weight > MaxWeight {
			return nil, fmt.Errorf("ring: node %q weight %d out of range 1..%d", n.ID, n.Weight, MaxWeight)
		}
		offsets[i+1] = offsets[i] + int(n.Weight)*ppw
	}
	total := offsets[len(r.nodes)]
	if total > parallelPoints && r.bucketed(total, offsets) {
		return r, nil
	}
	r.hashes = make([]uint64, total)
	r.owners = make([]int32, total)
	r.eachNodeChunk(total, func(lo, hi int, sc *scratch) {
		r.hashNodes(lo, hi, offsets[lo], r.hashes, r.owners, &sc.buf)
	})
	sortPoints(r.hashes, r.owners)
	return r, nil
}

// eachNodeChunk runs f over the nodes in chunks of nodeChunk, on up to 8 goroutines when
// the ring has more than parallelPoints points. Chunks are handed out by an atomic cursor
// so that one slow goroutine (or a heavy node) does not hold up the rest.
func (r *Ring) eachNodeChunk(total int, f func(lo, hi int, sc *scratch)) {
	workers := 1
	if total > parallelPoints {
		workers = min(runtime.GOMAXPROCS(0), 8, (len(r.nodes)+nodeChunk-1)/nodeChunk)
	}
	var next atomic.Int64
	work := func() {
		var sc scratch
		for {
			lo := int(next.Add(nodeChunk)) - nodeChunk
			if lo >= len(r.nodes) {
				return
			}
			f(lo, min(lo+nodeChunk, len(r.nodes)), &sc)
		}
	}
	if workers <= 1 {
		work()
		return
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	wg.Wait()
}

const (
	nodeChunk   = 8
	bucketBits  = 8 // 256 buckets by the top byte of a point's hash
	bucketCount = 1 << bucketBits
)

// scratch is one worker's reusable buffers.
type scratch struct {
	buf []byte
	h   []uint64
	n   []int32
}

// bucketSlack is how many points beyond its expected share each bucket has room for, in
// standard deviations (a variable so a test can force the overflow path).
var bucketSlack = 6.0

// bucketed builds a large ring without a global sort, whose in-place permutation of 12 MiB
// at 1,000 nodes is a serial chain of cache misses (two thirds of the build). Points are
// scattered by the top byte of their hash into 256 buckets as they are hashed (each worker
// reserves a run of a bucket with one atomic add per chunk of nodes), the buckets are sorted
// independently and in parallel (48 KiB each at 1,000 nodes: in cache), and then closed up
// into one array. Buckets have room for their expected share plus bucketSlack standard
// deviations (hashes are uniform, so ~11% at 1,000 nodes); false when one overflows (never
// seen; the caller then builds the plain way). The result is the same (hash, owner) order.
func (r *Ring) bucketed(total int, offsets []int) bool {
	expect := float64(total) / bucketCount
	room := max(int(expect+bucketSlack*math.Sqrt(expect))+64, 1)
	h := make([]uint64, room*bucketCount)
	n := make([]int32, room*bucketCount)
	var fill [bucketCount]atomic.Int64
	var overflow atomic.Bool
	r.eachNodeChunk(total, func(lo, hi int, sc *scratch) {
		if overflow.Load() {
			return
		}
		cnt := offsets[hi] - offsets[lo]
		if cap(sc.h) < cnt {
			sc.h, sc.n = make([]uint64, cnt), make([]int32, cnt)
		}
		lh, ln := sc.h[:cnt], sc.n[:cnt]
		r.hashNodes(lo, hi, 0, lh, ln, &sc.buf)
		var per [bucketCount]int
		for _, x := range lh {
			per[x>>(64-bucketBits)]++
		}
		var at [bucketCount]int
		for b, c := range per {
			if c == 0 {
				continue
			}
			o := int(fill[b].Add(int64(c))) - c
			if o+c > room {
				overflow.Store(true)
				return
			}
			at[b] = b*room + o
		}
		for i, x := range lh {
			b := x >> (64 - bucketBits)
			h[at[b]], n[at[b]] = x, ln[i]
			at[b]++
		}
	})
	if overflow.Load() {
		return false
	}
	// Sort the buckets on the same goroutine budget.
	workers := min(runtime.GOMAXPROCS(0), 8)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh, sn := make([]uint64, room), make([]int32, room)
			count := make([]int32, 1<<subBits)
			for {
				b := int(next.Add(1)) - 1
				if b >= bucketCount {
					return
				}
				lo, hi := b*room, b*room+int(fill[b].Load())
				sortBucket(h[lo:hi], n[lo:hi], sh, sn, count)
			}
		}()
	}
	wg.Wait()
	dst := 0
	for b := range fill {
		c := int(fill[b].Load())
		copy(h[dst:], h[b*room:b*room+c])
		copy(n[dst:], n[b*room:b*room+c])
		dst += c
	}
	r.hashes, r.owners = h[:total:total], n[:total:total]
	return true
}

// hashNodes writes the points of nodes [lo, hi) into h and n from index base on: node i's
// digest d is SHA-256(id + "#" + d), read as four little-endian 64-bit points.
func (r *Ring) hashNodes(lo, hi, base int, h []uint64, n []int32, bufp *[]byte) {
	buf := *bufp
	o := base
	for i := lo; i < hi; i++ {
		nd := r.nodes[i]
		digests := int(nd.Weight) * r.pointsPerWeight / 4
		buf = append(buf[:0], nd.ID...)
		buf = append(buf, '#')
		idLen := len(buf)
		for d := 0; d < digests; d++ {
			buf = strconv.AppendInt(buf[:idLen], int64(d), 10)
			sum := sha256.Sum256(buf)
			for k := 0; k < 4; k++ {
				h[o] = binary.LittleEndian.Uint64(sum[8*k:])
				n[o] = int32(i)
				o++
			}
		}
	}
	*bufp = buf
}

// sortPoints sorts the parallel arrays by (hash, owner) in place, with no scratch copy of
// the points: a most-significant-byte-first radix sort (American flag: 256 buckets a
// level, so the bucket heads stay in cache; hashes are uniform, so two levels leave a
// handful of points a bucket), then an insertion sort of each small bucket. Ties
// (astronomically rare) resolve to the smaller node index, i.e. the smaller node id,
// identically in every language.
func sortPoints(h []uint64, n []int32) { radixSort(h, n, 56) }

func radixSort(h []uint64, n []int32, shift uint) {
	if len(h) <= 32 {
		insertionSort(h, n)
		return
	}
	var next, end [256]int
	for _, x := range h {
		end[(x>>shift)&0xff]++
	}
	sum := 0
	for b := range end {
		next[b] = sum
		sum += end[b]
		end[b] = sum
	}
	for b := 0; b < 256; b++ {
		for i := next[b]; i < end[b]; i = next[b] {
			d := int((h[i] >> shift) & 0xff)
			if d == b {
				next[b]++
				continue
			}
			j := next[d]
			next[d]++
			h[i], h[j] = h[j], h[i]
			n[i], n[j] = n[j], n[i]
		}
	}
	lo := 0
	for b := 0; b < 256; b++ {
		hi := end[b]
		switch {
		case hi-lo < 2:
		case shift == 0: // the whole hash is equal: order by owner
			insertionSort(h[lo:hi], n[lo:hi])
		default:
			radixSort(h[lo:hi], n[lo:hi], shift-8)
		}
		lo = hi
	}
}

// subBits: a bucket is scattered by the next 12 bits of its hashes, about one point a
// sub-bucket at 1,000 nodes, so what is left is a nearly sorted run.
const subBits = 12

// sortBucket sorts one bucket (its points share the top byte) by (hash, owner): one
// counting scatter by the next subBits bits into the scratch sh/sn, an insertion sort of
// the nearly sorted result, and a copy back. A bucket with a crowded sub-bucket (equal
// hashes: crafted ids) goes through radixSort instead.
func sortBucket(h []uint64, n []int32, sh []uint64, sn []int32, count []int32) {
	const shift = 64 - bucketBits - subBits
	clear(count)
	for _, x := range h {
		d := (x >> shift) & (1<<subBits - 1)
		count[d]++
		if count[d] > 32 {
			radixSort(h, n, 64-bucketBits-8)
			return
		}
	}
	sum := int32(0)
	for d, c := range count {
		count[d] = sum
		sum += c
	}
	sh, sn = sh[:len(h)], sn[:len(h)]
	for i, x := range h {
		d := (x >> shift) & (1<<subBits - 1)
		j := count[d]
		count[d]++
		sh[j], sn[j] = x, n[i]
	}
	for i := 1; i < len(sh); i++ { // only points of one sub-bucket are out of order
		for j := i; j > 0 && less(sh, sn, j, j-1); j-- {
			sh[j], sh[j-1] = sh[j-1], sh[j]
			sn[j], sn[j-1] = sn[j-1], sn[j]
		}
	}
	copy(h, sh)
	copy(n, sn)
}

func less(h []uint64, n []int32, i, j int) bool {
	return h[i] < h[j] || (h[i] == h[j] && n[i] < n[j])
}

// insertionSort sorts one small bucket; a large one (only equal hashes: crafted ids) goes
// through a general sort.
func insertionSort(h []uint64, n []int32) {
	if len(h) > 64 {
		sort.Sort(pairs{h, n})
		return
	}
	for i := 1; i < len(h); i++ {
		for j := i; j > 0 && less(h, n, j, j-1); j-- {
			h[j], h[j-1] = h[j-1], h[j]
			n[j], n[j-1] = n[j-1], n[j]
		}
	}
}

type pairs struct {
	h []uint64
	n []int32
}

func (p pairs) Len() int           { return len(p.h) }
func (p pairs) Less(i, j int) bool { return less(p.h, p.n, i, j) }
func (p pairs) Swap(i, j int) {
	p.h[i], p.h[j] = p.h[j], p.h[i]
	p.n[i], p.n[j] = p.n[j], p.n[i]
}

// Len returns the number of nodes.
func (r *Ring) Len() int { return len(r.nodes) }

// PointsPerWeight returns the ring's density.
func (r *Ring) PointsPerWeight() int { return r.pointsPerWeight }

// Nodes returns the members sorted by id.
func (r *Ring) Nodes() []Node { return append([]Node(nil), r.nodes...) }

// Owner returns the index (into Nodes()) and id of the node owning position h, the first
// point at or after h, wrapping around. It returns -1, "" for an empty ring.
func (r *Ring) Owner(h uint64) (int, string) {
	if len(r.hashes) == 0 {
		return -1, ""
	}
	i, _ := slices.BinarySearch(r.hashes, h) // first point >= h
	if i == len(r.hashes) {
		i = 0
	}
	n := r.owners[i]
	return int(n), r.nodes[n].ID
}

// Points returns the ring's points in search order (hashes ascending) and, for each, the
// index in Nodes() of the node it belongs to. A router outside Go (the C ABI's GET fast
// path) finds an owner as Owner does: the first point whose hash is >= h, else the first.
// The slices are the ring's own (no copy: 12 MiB at 1,000 nodes): callers must not modify them.
func (r *Ring) Points() (hashes []uint64, nodes []int32) {
	return r.hashes, r.owners
}

// Shares returns each node's fraction of the 64-bit hash space, keyed by node id.
func (r *Ring) Shares() map[string]float64 {
	out := make(map[string]float64, len(r.nodes))
	if len(r.hashes) == 0 {
		return out
	}
	const space = float64(1<<63) * 2
	prev := r.hashes[len(r.hashes)-1]
	for i, h := range r.hashes {
		// The arc (prev, h] belongs to point i; unsigned subtraction handles the wrap.
		out[r.nodes[r.owners[i]].ID] += float64(h-prev) / space
		prev = h
	}
	return out
}
