package cabi

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestCallerThreadsRaisesGOMAXPROCS(t *testing.T) {
	orig, origPinned := runtime.GOMAXPROCS(0), procsPinned
	t.Cleanup(func() { runtime.GOMAXPROCS(orig); procsPinned = origPinned })
	procsPinned = false
	runtime.GOMAXPROCS(2)

	steps := []struct {
		threads, want int
	}{
		{1, 2},                    // 1 thread + 1 fits in 2: unchanged
		{5, 6},                    // raised to threads + 1
		{3, 6},                    // never lowered
		{10 * maxProcs, maxProcs}, // capped
	}
	for _, s := range steps {
		if got := CallerThreads(s.threads); got != s.want || runtime.GOMAXPROCS(0) != s.want {
			t.Fatalf("CallerThreads(%d) = %d, GOMAXPROCS %d; want %d", s.threads, got, runtime.GOMAXPROCS(0), s.want)
		}
	}

	runtime.GOMAXPROCS(2)
	procsPinned = true // GOMAXPROCS set in the environment
	if got := CallerThreads(7); got != 2 || runtime.GOMAXPROCS(0) != 2 {
		t.Fatalf("pinned: CallerThreads(7) = %d, GOMAXPROCS %d; want 2", got, runtime.GOMAXPROCS(0))
	}
}

func TestCallerStats(t *testing.T) {
	orig := CallerCount
	t.Cleanup(func() { CallerCount = orig })
	CallerCount = func() int { return 3 }
	before := yields.Load()
	Yield()
	if yields.Load() != before+1 {
		t.Fatal("Yield not counted")
	}
	text := string(callerStats(nil))
	for _, want := range []string{
		"dfkv_cabi_caller_threads 3\n",
		"dfkv_cabi_gomaxprocs " + strconv.Itoa(runtime.GOMAXPROCS(0)) + "\n",
		"dfkv_cabi_yields_total " + strconv.FormatUint(before+1, 10) + "\n",
		"# TYPE dfkv_cabi_caller_threads gauge\n",
		"# TYPE dfkv_cabi_yields_total counter\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("stats lack %q:\n%s", want, text)
		}
	}
	CallerCount = nil // before the C side has set it
	if !strings.Contains(string(callerStats(nil)), "dfkv_cabi_caller_threads 0\n") {
		t.Error("no C side: caller threads not 0")
	}
}
