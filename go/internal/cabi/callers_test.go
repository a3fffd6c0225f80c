package cabi

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

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
