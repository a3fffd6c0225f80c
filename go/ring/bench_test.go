package ring

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
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
