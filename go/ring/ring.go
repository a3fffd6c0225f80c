package ring

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
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

type point struct {
	hash uint64
	node int32 // index into Ring.nodes
}

// Ring is immutable once built and safe for concurrent use.
type Ring struct {
	nodes           []Node
	points          []point
	pointsPerWeight int
}

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
	sort.Slice(r.nodes, func(i, j int) bool { return r.nodes[i].ID < r.nodes[j].ID })
	total := 0
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
		total += int(n.Weight) * ppw
	}
	r.points = make([]point, 0, total)
	for i, n := range r.nodes {
		digests := int(n.Weight) * ppw / 4
		buf := make([]byte, 0, len(n.ID)+12)
		for d := 0; d < digests; d++ {
			buf = append(buf[:0], n.ID...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(d), 10)
			sum := sha256.Sum256(buf)
			for k := 0; k < 4; k++ {
				r.points = append(r.points, point{hash: binary.LittleEndian.Uint64(sum[8*k:]), node: int32(i)})
			}
		}
	}
	// Ties (astronomically rare) resolve to the smaller node id, identically in every language.
	sort.Slice(r.points, func(i, j int) bool {
		if r.points[i].hash != r.points[j].hash {
			return r.points[i].hash < r.points[j].hash
		}
		return r.points[i].node < r.points[j].node
	})
	return r, nil
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
	if len(r.points) == 0 {
		return -1, ""
	}
	i := sort.Search(len(r.points), func(i int) bool { return r.points[i].hash >= h })
	if i == len(r.points) {
		i = 0
	}
	n := r.points[i].node
	return int(n), r.nodes[n].ID
}

// Points returns the ring's points in search order (hashes ascending) and, for each, the
// index in Nodes() of the node it belongs to. A router outside Go (the C ABI's GET fast
// path) finds an owner as Owner does: the first point whose hash is >= h, else the first.
func (r *Ring) Points() (hashes []uint64, nodes []int32) {
	hashes = make([]uint64, len(r.points))
	nodes = make([]int32, len(r.points))
	for i, p := range r.points {
		hashes[i], nodes[i] = p.hash, p.node
	}
	return hashes, nodes
}

// Shares returns each node's fraction of the 64-bit hash space, keyed by node id.
func (r *Ring) Shares() map[string]float64 {
	out := make(map[string]float64, len(r.nodes))
	if len(r.points) == 0 {
		return out
	}
	const space = float64(1<<63) * 2
	prev := r.points[len(r.points)-1].hash
	for _, p := range r.points {
		// The arc (prev, p.hash] belongs to p; unsigned subtraction handles the wrap.
		out[r.nodes[p.node].ID] += float64(p.hash-prev) / space
		prev = p.hash
	}
	return out
}
