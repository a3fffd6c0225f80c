//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// clusterBins finds etcd and the dfkv_server/dfkv_mds binaries for a mode test:
// DFKV_BIN_DIR (tools/build.sh) or, without it, a go build into a temp dir.
func clusterBins(t *testing.T) (etcd, bin string) {
	t.Helper()
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd not on PATH (apt-get install -y etcd-server; tools/test.sh installs it): %v", err)
	}
	if bin = os.Getenv("DFKV_BIN_DIR"); bin != "" {
		return etcd, bin
	}
	bin = t.TempDir()
	for pkg, name := range map[string]string{"server": "dfkv_server", "mds": "dfkv_mds"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, name), "../"+pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return etcd, bin
}

// TestSeenAfter: a ring that returns to an earlier membership has the earlier epoch again;
// an event must match the client's move after the event began, not the old one.
func TestSeenAfter(t *testing.T) {
	t0 := time.Unix(100, 0)
	as := []arrival{{t0, 1}, {t0.Add(time.Second), 2}, {t0.Add(2 * time.Second), 1}}
	for _, tc := range []struct {
		epoch uint64
		since time.Time
		want  time.Time
		ok    bool
	}{
		{1, t0, t0, true},
		{1, t0.Add(time.Millisecond), t0.Add(2 * time.Second), true},
		{2, t0.Add(1500 * time.Millisecond), time.Time{}, false},
		{3, time.Time{}, time.Time{}, false},
	} {
		if got, ok := seenAfter(as, tc.epoch, tc.since); ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("seenAfter(%d, %v) = %v %v, want %v %v", tc.epoch, tc.since, got, ok, tc.want, tc.ok)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p50, p99, mx := pct(ds, .5), pct(ds, .99), maxDur(ds); p50 != 51*time.Millisecond || p99 != 99*time.Millisecond || mx != 100*time.Millisecond {
		t.Fatalf("p50 %v p99 %v max %v", p50, p99, mx)
	}
	if pct(nil, .5) != 0 || maxDur(nil) != 0 {
		t.Fatal("empty input")
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{nil, {"replay"}, {"membership", "--nodes", "1"}, {"membership", "--full", "9", "--clients", "3"}, {"membership", "--bogus"}, {"rolling", "--nodes", "1"}, {"rolling", "--value", "8"}, {"partition", "--nodes", "1"}, {"partition", "--hold", "0s"}} {
		var out, errb bytes.Buffer
		if rc := run(args, &out, &errb); rc != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, rc, errb.String())
		}
	}
}
