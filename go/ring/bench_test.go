package ring

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time: on a shared machine wall time per op
// mostly measures the other tenants, CPU time what a build costs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchNodes(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("node-%04d", i), Weight: 1}
	}
	return nodes
}

// BenchmarkNew1000 builds the client's placement ring at 1,000 nodes of weight 1 and the
// default 1,024 points per weight (the membership-at-scale bound: ≤ 50 ms, ≤ 16 MiB). It
// reports the ring's retained bytes next to the allocation per build.
func BenchmarkNew1000(b *testing.B) {
	nodes := benchNodes(1000)
	b.ReportAllocs()
	var r *Ring
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		var err error
		if r, err = New(nodes); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N)/1e6, "cpu-ms/op")
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	keep, _ := New(nodes)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MiB")
	runtime.KeepAlive(keep)
	runtime.KeepAlive(r)
}

// BenchmarkNew128 is the 128-node ring every client of the cluster harness rebuilds per change.
func BenchmarkNew128(b *testing.B) {
	nodes := benchNodes(128)
	b.ReportAllocs()
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		if _, err := New(nodes); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N)/1e6, "cpu-ms/op")
}

// TestSortPointsMatchesReference: the radix sort orders (hash, owner) exactly as a
// comparison sort does, also with many equal hashes (ties go to the smaller owner) and
// on sizes around the insertion-sort cutoff.
func TestSortPointsMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 31, 32, 33, 100, 1000, 70000} {
		for _, dupes := range []bool{false, true} {
			h := make([]uint64, n)
			o := make([]int32, n)
			for i := range h {
				h[i], o[i] = rng.Uint64(), int32(rng.IntN(50))
				if dupes {
					h[i] = uint64(rng.IntN(5)) << 60 // few distinct hashes: long tie runs
				}
			}
			type p struct {
				h uint64
				o int32
			}
			ref := make([]p, n)
			for i := range h {
				ref[i] = p{h[i], o[i]}
			}
			sort.Slice(ref, func(i, j int) bool { return ref[i].h < ref[j].h || ref[i].h == ref[j].h && ref[i].o < ref[j].o })
			sortPoints(h, o)
			for i := range ref {
				if h[i] != ref[i].h || o[i] != ref[i].o {
					t.Fatalf("n=%d dupes=%v: point %d is (%#x,%d), want (%#x,%d)", n, dupes, i, h[i], o[i], ref[i].h, ref[i].o)
				}
			}
		}
	}
}

// referencePoints is the placement written out plainly: every digest of every node, then
// one comparison sort by (hash, owner index).
func referencePoints(nodes []Node, ppw int) ([]uint64, []int32) {
	sorted := append([]Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	type p struct {
		h uint64
		o int32
	}
	var ps []p
	for i, n := range sorted {
		for d := 0; d < int(n.Weight)*ppw/4; d++ {
			sum := sha256.Sum256([]byte(n.ID + "#" + strconv.Itoa(d)))
			for k := 0; k < 4; k++ {
				ps = append(ps, p{binary.LittleEndian.Uint64(sum[8*k:]), int32(i)})
			}
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].h < ps[j].h || ps[i].h == ps[j].h && ps[i].o < ps[j].o })
	h, o := make([]uint64, len(ps)), make([]int32, len(ps))
	for i, x := range ps {
		h[i], o[i] = x.h, x.o
	}
	return h, o
}

// TestLargeRingMatchesReference: the bucketed build of a large ring (more than
// parallelPoints points), on one goroutine and on several, and its fallback when a bucket
// overflows, give exactly the reference placement.
func TestLargeRingMatchesReference(t *testing.T) {
	nodes := benchNodes(90)
	nodes[7].Weight, nodes[50].Weight = 3, 2
	wantH, wantO := referencePoints(nodes, PointsPerWeight)
	check := func(name string) {
		t.Helper()
		r, err := New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		h, o := r.Points()
		if len(h) != len(wantH) {
			t.Fatalf("%s: %d points, want %d", name, len(h), len(wantH))
		}
		for i := range h {
			if h[i] != wantH[i] || o[i] != wantO[i] {
				t.Fatalf("%s: point %d is (%#x,%d), want (%#x,%d)", name, i, h[i], o[i], wantH[i], wantO[i])
			}
		}
	}
	for _, procs := range []int{1, 4} {
		prev := runtime.GOMAXPROCS(procs)
		check(fmt.Sprintf("GOMAXPROCS=%d", procs))
		runtime.GOMAXPROCS(prev)
	}
	old := bucketSlack
	bucketSlack = -3 // room below the expected share: some bucket overflows
	defer func() { bucketSlack = old }()
	r := &Ring{nodes: nodes[:0:0], pointsPerWeight: PointsPerWeight}
	r.nodes = append(r.nodes, nodes...)
	sort.Slice(r.nodes, func(i, j int) bool { return r.nodes[i].ID < r.nodes[j].ID })
	offs := make([]int, len(r.nodes)+1)
	for i, n := range r.nodes {
		offs[i+1] = offs[i] + int(n.Weight)*PointsPerWeight
	}
	if r.bucketed(offs[len(r.nodes)], offs) {
		t.Fatal("no bucket overflowed with the room below the expected share")
	}
	check("after an overflow")
}
