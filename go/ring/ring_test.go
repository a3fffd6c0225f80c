package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// sampleOwners routes n pseudo-random positions and counts owners by id.
func sampleOwners(r *Ring, n int, seed uint64) map[string]int {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := map[string]int{}
	for range n {
		_, id := r.Owner(rng.Uint64())
		out[id]++
	}
	return out
}

func mustNew(t *testing.T, nodes []Node, opts ...Option) *Ring {
	t.Helper()
	r, err := New(nodes, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The tolerance this package promises: every node's share of keys is within 8% (relative)
// of weight/total with the default 1,024 points per weight, and within 25% with the legacy
// 160, for rings of up to 16 nodes and weights up to 8. Measured by routing keys, not by
// Shares (which uses the same points).
func TestWeightedShares(t *testing.T) {
	for _, d := range []struct {
		ppw       int
		tolerance float64
	}{{PointsPerWeight, 0.08}, {LegacyPointsPerWeight, 0.25}} {
		t.Run(fmt.Sprintf("ppw=%d", d.ppw), func(t *testing.T) { testWeightedShares(t, d.ppw, d.tolerance) })
	}
}

func testWeightedShares(t *testing.T, ppw int, tolerance float64) {
	tests := []struct {
		name    string
		weights []uint32
	}{
		{"three equal", []uint32{1, 1, 1}},
		{"one double", []uint32{1, 2, 1}},
		{"steep", []uint32{1, 8}},
		{"sixteen mixed", []uint32{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}},
		{"eight equal", []uint32{1, 1, 1, 1, 1, 1, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []Node
			total := 0.0
			for i, w := range tc.weights {
				nodes = append(nodes, Node{ID: fmt.Sprintf("node-%02d", i), Weight: w})
				total += float64(w)
			}
			r := mustNew(t, nodes, WithPointsPerWeight(ppw))
			if r.PointsPerWeight() != ppw {
				t.Fatalf("PointsPerWeight = %d, want %d", r.PointsPerWeight(), ppw)
			}
			const n = 400_000
			counts := sampleOwners(r, n, 7)
			shares := r.Shares()
			sum := 0.0
			for _, nd := range nodes {
				want := float64(nd.Weight) / total
				got := float64(counts[nd.ID]) / n
				if dev := math.Abs(got/want - 1); dev > tolerance {
					t.Errorf("%s (weight %d): %.4f of keys, want %.4f ±%.0f%% (off by %.1f%%)",
						nd.ID, nd.Weight, got, want, tolerance*100, dev*100)
				}
				// Shares describes the same ring: it must agree with routing up to sampling
				// noise (400k samples: a few tenths of a percent).
				if math.Abs(shares[nd.ID]-got) > 0.01 {
					t.Errorf("%s: Shares says %.4f, routing gives %.4f", nd.ID, shares[nd.ID], got)
				}
				sum += shares[nd.ID]
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Errorf("shares sum to %v", sum)
			}
		})
	}
}

// Adding a node moves keys only onto the new node, and about 1/(N+1) of them; removing one
// moves only the removed node's keys. These are exact properties of consistent hashing.
func TestMinimalMovement(t *testing.T) {
	base := []Node{{"a", 1}, {"b", 1}, {"c", 2}, {"d", 1}}
	grown := append(append([]Node(nil), base...), Node{"e", 1})
	r1, r2 := mustNew(t, base), mustNew(t, grown)
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	moved := 0
	for range n {
		h := rng.Uint64()
		_, before := r1.Owner(h)
		_, after := r2.Owner(h)
		if before == after {
			continue
		}
		moved++
		if after != "e" {
			t.Fatalf("adding e moved a key from %s to %s", before, after)
		}
	}
	// e has weight 1 of 6: expect ~1/6 of the keys, within the share tolerance.
	if frac := float64(moved) / n; math.Abs(frac/(1.0/6)-1) > 0.25 {
		t.Fatalf("adding one node of weight 1 (of 6) moved %.3f of the keys, want ~%.3f", frac, 1.0/6)
	}

	// Removing b: only b's keys move, and each lands on a surviving node.
	shrunk := []Node{{"a", 1}, {"c", 2}, {"d", 1}}
	r3 := mustNew(t, shrunk)
	for range n {
		h := rng.Uint64()
		_, before := r1.Owner(h)
		_, after := r3.Owner(h)
		if before != "b" && before != after {
			t.Fatalf("removing b moved a key from %s to %s", before, after)
		}
		if after == "b" {
			t.Fatal("a removed node still owns a key")
		}
	}
	// Raising a weight only moves keys onto that node.
	heavier := []Node{{"a", 1}, {"b", 3}, {"c", 2}, {"d", 1}}
	r4 := mustNew(t, heavier)
	for range n {
		h := rng.Uint64()
		_, before := r1.Owner(h)
		_, after := r4.Owner(h)
		if before != after && after != "b" {
			t.Fatalf("raising b's weight moved a key from %s to %s", before, after)
		}
	}
}

func TestDeterministicAndOrderFree(t *testing.T) {
	a := mustNew(t, []Node{{"x", 1}, {"y", 2}, {"z", 1}})
	b := mustNew(t, []Node{{"z", 1}, {"x", 1}, {"y", 2}})
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10_000 {
		h := rng.Uint64()
		i1, id1 := a.Owner(h)
		i2, id2 := b.Owner(h)
		if id1 != id2 || i1 != i2 {
			t.Fatalf("owner of %x: %s/%d vs %s/%d", h, id1, i1, id2, i2)
		}
	}
	// Wrap-around: the largest position belongs to the owner of the first point.
	_, top := a.Owner(math.MaxUint64)
	_, zero := a.Owner(0)
	if top != zero {
		t.Fatalf("Owner(max)=%s, Owner(0)=%s: positions past the last point must wrap", top, zero)
	}
	if got := a.Nodes(); got[0].ID != "x" || got[1].ID != "y" || got[2].ID != "z" || a.Len() != 3 {
		t.Fatalf("Nodes = %v", got)
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name  string
		nodes []Node
		want  string
		opts  []Option
	}{
		{"empty id", []Node{{"", 1}}, "empty node id", nil},
		{"duplicate", []Node{{"a", 1}, {"a", 2}}, "duplicate", nil},
		{"zero weight", []Node{{"a", 0}}, "out of range", nil},
		{"huge weight", []Node{{"a", MaxWeight + 1}}, "out of range", nil},
		{"density not a multiple of 4", []Node{{"a", 1}}, "points per weight", []Option{WithPointsPerWeight(162)}},
		{"density negative", []Node{{"a", 1}}, "points per weight", []Option{WithPointsPerWeight(-4)}},
		{"density too high", []Node{{"a", 1}}, "points per weight", []Option{WithPointsPerWeight(MaxPointsPerWeight + 4)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.nodes, tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	if d := mustNew(t, []Node{{"a", 1}}, WithPointsPerWeight(0)).PointsPerWeight(); d != PointsPerWeight {
		t.Fatalf("WithPointsPerWeight(0) gives %d points per weight, want the default %d", d, PointsPerWeight)
	}
	r := mustNew(t, nil)
	if i, id := r.Owner(42); i != -1 || id != "" {
		t.Fatalf("empty ring Owner = %d %q", i, id)
	}
	if len(r.Shares()) != 0 {
		t.Fatal("empty ring has shares")
	}
}

// TestPointsRouteLikeOwner checks that Points, searched as its comment says, gives the owner
// Owner gives, including the wrap past the last point.
func TestPointsRouteLikeOwner(t *testing.T) {
	r, err := New([]Node{{ID: "a", Weight: 1}, {ID: "b", Weight: 2}, {ID: "c", Weight: 1}}, WithPointsPerWeight(16))
	if err != nil {
		t.Fatal(err)
	}
	hashes, nodes := r.Points()
	if len(hashes) != 4*16 || len(nodes) != len(hashes) {
		t.Fatalf("%d hashes, %d nodes; want %d", len(hashes), len(nodes), 4*16)
	}
	probe := []uint64{0, 1, hashes[0], hashes[len(hashes)-1], hashes[len(hashes)-1] + 1, ^uint64(0)}
	for i := uint64(0); i < 2000; i++ {
		probe = append(probe, i*0x9E3779B97F4A7C15)
	}
	for _, h := range probe {
		j := 0
		for j < len(hashes) && hashes[j] < h {
			j++
		}
		if j == len(hashes) {
			j = 0
		}
		want, _ := r.Owner(h)
		if int(nodes[j]) != want {
			t.Fatalf("hash %#x: points say node %d, Owner says %d", h, nodes[j], want)
		}
	}
}
