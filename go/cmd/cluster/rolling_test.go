//go:build linux

package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestRollingRestartSmall is the rolling mode at CI size: a three-member etcd, two MDS
// replicas and four real dfkv_server nodes restarted one after another (SIGTERM, start with
// the same data) under four reading workers. rolling itself fails the run on one wrong byte
// or on a hit ratio that is not back to >= 95% of before within --settle; the test also
// checks the report says so. DFKV_BIN_DIR points at built binaries (tools/build.sh);
// without it the test builds dfkv_server and dfkv_mds.
func TestRollingRestartSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts etcd, two MDS and four nodes (about 40 s)")
	}
	etcd, bin := clusterBins(t)
	var out, errb bytes.Buffer
	rc := run([]string{"rolling", "--bin", bin, "--etcd", etcd, "--nodes", "4", "--keys", "3000", "--value", "2048",
		"--warm", "6s", "--settle", "15s", "--node-cap", "32MiB", "--max-time", "4m"}, &out, &errb)
	t.Logf("report:\n%s", out.String())
	if rc != 0 {
		t.Fatalf("rolling exit %d\n%s", rc, tail(errb.String(), 40))
	}
	report := out.String()
	if !regexp.MustCompile(`(?m)^reads: \d+ hits, \d+ misses, \d+ errors, 0 wrong bytes$`).MatchString(report) {
		t.Fatalf("report does not show zero wrong bytes:\n%s", report)
	}
	if !regexp.MustCompile(`(?m)^back to >= 95% of before \(every 1 s sample\) \d+ s after the last restart$`).MatchString(report) {
		t.Fatalf("report does not show the recovery:\n%s", report)
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}
