package cabi

import (
	"fmt"
	"runtime"
	"sync/atomic"
)

// The C ABI's callers are foreign threads, and each keeps a Go P while it runs its own code
// between calls. dfkv_abi.c counts them and makes each busy one yield now and then while
// there are fewer of them than Ps; this side does the yield and renders the figures for the
// stats snapshot. docs/BENCHMARKS.md, "C ABI, part 4", has the measurements.

// CallerCount reports the live count of caller threads (set by the library's C side; nil in
// tests of this package, where the stats show 0).
var CallerCount func() int

var yields atomic.Uint64

// Yield schedules the calling goroutine anew, which marks its P as recently scheduled, so
// sysmon does not take it from the caller's thread (dfkv_abi.c calls it about every 6 ms
// from a thread that calls steadily).
func Yield() {
	yields.Add(1)
	runtime.Gosched()
}

// callerStats renders the gauges and counter of the caller tracking (Prometheus text).
func callerStats(b []byte) []byte {
	threads := 0
	if CallerCount != nil {
		threads = CallerCount()
	}
	return fmt.Appendf(b, "# HELP dfkv_cabi_caller_threads C threads that have made data calls and not exited.\n"+
		"# TYPE dfkv_cabi_caller_threads gauge\ndfkv_cabi_caller_threads %d\n"+
		"# HELP dfkv_cabi_gomaxprocs The library's GOMAXPROCS; busy caller threads yield only while fewer than this.\n"+
		"# TYPE dfkv_cabi_gomaxprocs gauge\ndfkv_cabi_gomaxprocs %d\n"+
		"# HELP dfkv_cabi_yields_total Yields of busy caller threads that keep their Go P from being taken back.\n"+
		"# TYPE dfkv_cabi_yields_total counter\ndfkv_cabi_yields_total %d\n",
		threads, runtime.GOMAXPROCS(0), yields.Load())
}
