//go:build linux

package ramtier

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// Warm GET from the arena against a plain memcpy of the same size (the floor for any
// in-memory server), and cold GET (promotion: one O_DIRECT read into the arena slot)
// against the slab engine's own Get, at 1 MiB and 8 workers. The callbacks copy the value
// out, standing in for the socket write.
const (
	benchSize    = 1 << 20
	benchWorkers = 8
	benchKeys    = 64
)

func runParallel(b *testing.B, op func(w, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.SetBytes(benchSize)
	b.ReportAllocs()
	b.ResetTimer()
	for w := 0; w < benchWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(w, i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
}

func sinks(b *testing.B) [][]byte {
	s := make([][]byte, benchWorkers)
	for i := range s {
		m, err := mapArena(benchSize, false)
		if err != nil {
			b.Fatal(err)
		}
		s[i] = m
	}
	return s
}

func BenchmarkMemcpy1MiB(b *testing.B) {
	src := val(1, benchSize)
	dst := sinks(b)
	runParallel(b, func(w, _ int) error { copy(dst[w], src); return nil })
}

func BenchmarkWarmGet1MiB(b *testing.B) {
	tr := newTier(b, store.NewMem(0), Config{ArenaBytes: 256 * mib})
	for i := 0; i < benchKeys; i++ {
		put(b, tr, key(i), val(i, benchSize))
	}
	dst := sinks(b)
	runParallel(b, func(w, i int) error {
		return tr.Get(key(i%benchKeys), func(v []byte) error { copy(dst[w], v); return nil })
	})
	if s := tr.RAMStats(); s.Misses != 0 {
		b.Fatalf("warm benchmark missed: %+v", s)
	}
}

func benchSlab(b *testing.B) *slab.Engine {
	e, err := slab.Open(slab.Config{Dir: b.TempDir(), CapacityBytes: 256 * mib, ExtentBytes: 64 * mib,
		MaxValueBytes: 4 * mib, BufferPoolBytes: 64 * mib, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < benchKeys; i++ {
		put(b, e, key(i), val(i, benchSize))
	}
	return e
}

func BenchmarkSlabGet1MiB(b *testing.B) {
	e := benchSlab(b)
	defer e.Close()
	dst := sinks(b)
	runParallel(b, func(w, i int) error {
		return e.Get(key(i%benchKeys), func(v []byte) error { copy(dst[w], v); return nil })
	})
}

// Every GET is cold: the arena (16 MiB) is much smaller than the key set (64 MiB) and keys
// are read round-robin, so each read promotes and the FIFO retires the oldest.
func BenchmarkColdGet1MiB(b *testing.B) {
	tr := newTier(b, benchSlab(b), Config{ArenaBytes: 16 * mib, Shards: 2, Policy: WriteAround})
	dst := sinks(b)
	runParallel(b, func(w, i int) error {
		return tr.Get(key(i%benchKeys), func(v []byte) error { copy(dst[w], v); return nil })
	})
	if s := tr.RAMStats(); s.Hits > int64(b.N)/10 {
		b.Logf("cold benchmark hit the arena %d times of %d", s.Hits, b.N)
	}
}

// What the write-back crash contract costs: a PUT of a new key touches no disk before its
// ack; a PUT overwriting a durable key first removes that version (a tombstone through the
// slab's group commit). Both sub-benchmarks seed b.N durable keys first; "new" writes other
// keys. Run with a fixed -benchtime (e.g. 2000x): the seeded keys must fit the slab.
func BenchmarkWriteBackPut64KiB(b *testing.B) {
	const size = 64 << 10
	for _, tc := range []struct {
		name   string
		offset int
	}{{"new", 1 << 20}, {"overwrite-durable", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := slab.Open(slab.Config{Dir: b.TempDir(), CapacityBytes: 1024 * mib, ExtentBytes: 64 * mib,
				MaxValueBytes: 4 * mib, BufferPoolBytes: 64 * mib, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			v := val(1, size)
			for i := 0; i < b.N; i++ {
				put(b, e, key(i), v)
			}
			tr := newTier(b, e, Config{ArenaBytes: 512 * mib, Shards: 8, Policy: WriteBack, DirtyBytes: 256 * mib})
			var next atomic.Int64
			var wg sync.WaitGroup
			b.SetBytes(size)
			b.ResetTimer()
			for w := 0; w < benchWorkers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						if err := tr.Put(key(i+tc.offset), size, func(d []byte) error { copy(d, v); return nil }); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if rs := tr.RAMStats(); (tc.offset == 0) != (rs.Tombstones == int64(b.N)) {
				b.Fatalf("tombstones %d of %d puts", rs.Tombstones, b.N)
			}
		})
	}
}

// Sustained write-back: distinct 1 MiB keys from 4 writers with a dirty budget (128 MiB)
// that fills early, so the run is bounded by the flushers; the clock stops when every
// dirty byte is on disk. "odirect" is the reference: raw O_DIRECT|O_DSYNC writes of the
// same size and concurrency to distinct offsets of a preallocated file in the same file
// system (what tools/bench compare's put_1MiB_wb_sustained line compares with). Run with
// a fixed count of at least 3x the budget, e.g. -benchtime=2000x (the slab holds 1 GiB and
// evicts beyond it).
func BenchmarkWriteBackSustained1MiB(b *testing.B) {
	const workers = 4
	const capacity = 1024 * mib
	b.Run("odirect", func(b *testing.B) {
		fd, err := vfs.Default.OpenDirect(filepath.Join(b.TempDir(), "raw"), true)
		if err != nil {
			b.Fatal(err)
		}
		defer fd.Close()
		if err := fd.Allocate(capacity); err != nil {
			b.Fatal(err)
		}
		bufs := sinks(b)
		var next atomic.Int64
		var wg sync.WaitGroup
		b.SetBytes(benchSize)
		b.ResetTimer()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= b.N {
						return
					}
					if _, err := fd.WriteAt(bufs[w], int64(i%(capacity/benchSize))*benchSize); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	})
	for _, flushers := range []int{0, 8} {
		b.Run(fmt.Sprintf("writeback-flushers=%d", flushers), func(b *testing.B) {
			e, err := slab.Open(slab.Config{Dir: b.TempDir(), CapacityBytes: capacity, ExtentBytes: 64 * mib,
				MaxValueBytes: 4 * mib, BufferPoolBytes: 64 * mib, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			tr := newTier(b, e, Config{ArenaBytes: 256 * mib, Shards: 8, Policy: WriteBack,
				DirtyBytes: 128 * mib, FlushThreads: flushers, DirtyWait: 2 * time.Second}) // as tools/bench
			v := val(1, benchSize)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.SetBytes(benchSize)
			b.ResetTimer()
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						if err := tr.Put(key(i), benchSize, func(d []byte) error { copy(d, v); return nil }); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for tr.wb.dirty.Load() > 0 {
				time.Sleep(100 * time.Microsecond) // polls the drain; not a stand-in for an event in a test
			}
			b.StopTimer()
			rs := tr.RAMStats()
			b.ReportMetric(float64(rs.Flushed)/float64(b.N), "flushed/op")
		})
	}
}
