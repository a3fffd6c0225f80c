//go:build linux

package slab

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// The Get/Put benchmarks compare the engine with raw O_DIRECT I/O on a preallocated file
// in the same file system, at the same block size (1 MiB) and concurrency (8).
const (
	benchWorkers = 8
	benchBlock   = 1 * mib
	benchKeys    = 128
)

func benchConfig(dir string) Config {
	return Config{Dir: dir, CapacityBytes: 256 * mib, ExtentBytes: 64 * mib, MaxValueBytes: 4 * mib,
		BufferPoolBytes: 64 * mib, Logger: quietLogger}
}

// runWorkers runs b.N calls of op spread over n goroutines.
func runWorkers(b *testing.B, n int, op func(worker, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range n {
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

func BenchmarkSlabGet1MiB(b *testing.B) {
	e := mustOpen(b, benchConfig(b.TempDir()))
	for i := range benchKeys {
		mustPut(b, e, testKey(i), testValue(i, benchBlock))
	}
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	runWorkers(b, benchWorkers, func(_, i int) error {
		return e.Get(testKey(i*7919%benchKeys), func([]byte) error { return nil })
	})
}

// filledForPuts opens a bench store filled to capacity once (every slot written) and
// returns it with the fill function the timed PUTs use.
func filledForPuts(b *testing.B) (*Engine, func([]byte) error) {
	e := mustOpen(b, benchConfig(b.TempDir()))
	src := testValue(1, benchBlock)
	fill := func(dst []byte) error {
		copy(dst, src)
		return nil
	}
	for i := range int(benchConfig("").CapacityBytes / benchBlock) {
		if err := e.Put(store.Key{ID: testKey(i).ID, Tenant: 2}, benchBlock, fill); err != nil {
			b.Fatal(err)
		}
	}
	return e, fill
}

// BenchmarkSlabPut1MiB measures the steady state: the store was filled once before the
// clock starts (so every slot has been written, like the raw file, and fallocated-but-
// unwritten extents do not charge the ext4 extent conversion to the engine), and every
// timed Put writes a new key, so it also evicts (tombstones in the same group commit).
func BenchmarkSlabPut1MiB(b *testing.B) {
	e, fill := filledForPuts(b)
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	runWorkers(b, benchWorkers, func(_, i int) error {
		return e.Put(store.Key{ID: testKey(i).ID, Tenant: 1}, benchBlock, fill)
	})
	s := e.Stats()
	b.ReportMetric(float64(s.Evictions)/float64(b.N), "evictions/op")
}

// rawFile returns an O_DIRECT|O_DSYNC descriptor of a preallocated, written file and one
// aligned buffer per worker.
func rawFile(b *testing.B) (vfs.File, [][]byte) {
	path := filepath.Join(b.TempDir(), "raw")
	fd, err := vfs.Default.OpenDirect(path, true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fd.Close() })
	if err := fd.Allocate(benchKeys * benchBlock); err != nil {
		b.Fatal(err)
	}
	bufs := make([][]byte, benchWorkers)
	for w := range bufs {
		if bufs[w], err = unix.Mmap(-1, 0, benchBlock, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
			b.Fatal(err)
		}
		buf := bufs[w]
		b.Cleanup(func() { unix.Munmap(buf) })
	}
	copy(bufs[0], testValue(1, benchBlock))
	for i := range benchKeys {
		if err := writeAt(fd, bufs[0], int64(i)*benchBlock); err != nil {
			b.Fatal(err)
		}
	}
	return fd, bufs
}

func BenchmarkODirectRead1MiB(b *testing.B) {
	fd, bufs := rawFile(b)
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	runWorkers(b, benchWorkers, func(w, i int) error {
		return readAt(fd, bufs[w], int64(i*7919%benchKeys)*benchBlock)
	})
}

// BenchmarkODirectWrite1MiB writes with the same durability as the engine's payload
// (O_DSYNC) and the same copy into the aligned buffer that Put's fill does.
func BenchmarkODirectWrite1MiB(b *testing.B) {
	fd, bufs := rawFile(b)
	src := testValue(1, benchBlock)
	b.SetBytes(benchBlock)
	b.ReportAllocs()
	runWorkers(b, benchWorkers, func(w, i int) error {
		copy(bufs[w], src)
		return writeAt(fd, bufs[w], int64(i%benchKeys)*benchBlock)
	})
}

// BenchmarkRebuild1M measures Open on a table of 1,000,000 live records (4 KiB values in
// 64 MiB extents), with the table dropped from the page cache before every Open.
func BenchmarkRebuild1M(b *testing.B) {
	const records = 1_000_000
	dir := b.TempDir()
	cfg := Config{Dir: dir, ExtentBytes: 64 * mib, MaxValueBytes: 4 * mib, Logger: quietLogger}
	perExt := int(cfg.ExtentBytes / blockSize)
	cfg.CapacityBytes = int64((records+perExt-1)/perExt) * cfg.ExtentBytes
	e, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Close(); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, tableName), os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 0, 8*mib)
	flush := func(at int64) {
		if _, err := f.WriteAt(chunk, at); err != nil {
			b.Fatal(err)
		}
	}
	start := int64(0)
	for i := range records {
		r := record{State: stateLive, Class: 0, Key: testKey(i), Length: 4096, CRC: uint32(i),
			Seq: uint64(i + 1), Address: uint64(i), Epoch: 1}
		var rb [recordSize]byte
		r.encode(rb[:])
		chunk = append(chunk, rb[:]...)
		if len(chunk) == cap(chunk) {
			flush(start)
			start += int64(len(chunk))
			chunk = chunk[:0]
		}
	}
	flush(start)
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		b.StartTimer()
		e, err := Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if n := e.Stats().Objects; n != records {
			b.Fatalf("rebuilt %d objects, want %d", n, records)
		}
		b.StopTimer()
		if err := e.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(records)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	f.Close()
}

// BenchmarkSlabPutVsODirect1MiB measures the slab PUT and the raw O_DIRECT|O_DSYNC write
// side by side in one run: the same engine state and raw file as BenchmarkSlabPut1MiB and
// BenchmarkODirectWrite1MiB, 8 workers each, alternating in chunks of 64 operations so that
// both see the same moments of a shared machine's drifting load. It reports the throughput
// ratio over the whole run (slab/odirect) and the median of the per-chunk-pair ratios
// (slab/odirect-median). b.N operations of each kind.
func BenchmarkSlabPutVsODirect1MiB(b *testing.B) {
	const chunk = 64
	e, fill := filledForPuts(b)
	fd, bufs := rawFile(b)
	// run does n operations of op over benchWorkers goroutines and returns the wall time.
	run := func(n int, op func(w, i int) error) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range benchWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
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
		return time.Since(start)
	}
	var slabT, rawT time.Duration
	var ratios []float64
	key := 0
	b.SetBytes(2 * benchBlock)
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		base := key
		key += n
		putOp := func(_, i int) error { return e.Put(store.Key{ID: testKey(base + i).ID, Tenant: 1}, benchBlock, fill) }
		rawOp := func(w, i int) error {
			_ = fill(bufs[w]) // the same copy the PUT's fill makes
			return writeAt(fd, bufs[w], int64((base+i)%benchKeys)*benchBlock)
		}
		var s, r time.Duration
		if (done/chunk)%2 == 0 { // alternate which goes first
			s, r = run(n, putOp), run(n, rawOp)
		} else {
			r, s = run(n, rawOp), run(n, putOp)
		}
		slabT, rawT = slabT+s, rawT+r
		ratios = append(ratios, r.Seconds()/s.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(rawT.Seconds()/slabT.Seconds(), "slab/odirect")
	b.ReportMetric(ratios[len(ratios)/2], "slab/odirect-median")
}
