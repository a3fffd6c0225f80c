package ring

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// PointsPerWeight is the number of ring points a node of weight 1 receives. Each SHA-256
// digest yields four 64-bit points, so a weight-1 node costs 40 digests.
const PointsPerWeight = 160

// MaxWeight bounds a node's weight so that a bad configuration cannot allocate a huge ring.
const MaxWeight = 1000

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
	nodes  []Node
	points []point
}

// New builds a ring. Node ids must be unique and non-empty; weights must be 1..MaxWeight.
func New(nodes []Node) (*Ring, error) {
	r := &Ring{nodes: append([]Node(nil), nodes...)}
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
		total += int(n.Weight) * PointsPerWeight
	}
	r.points = make([]point, 0, total)
	for i, n := range r.nodes {
		digests := int(n.Weight) * PointsPerWeight / 4
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
