//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestReplayHotSmall is the hot-object replay at CI size: eight real nodes and eight library
// clients replay the conversation trace's first 1,500 requests without and with
// --hot-spread. With it the busiest node's read load must be <= 1.25x the mean (without,
// the node owning the system-prompt block carries ~1.8x), the hit ratio >= 0.98x the run
// without, and no error or wrong byte in either (replay itself fails on those).
func TestReplayHotSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts etcd, two MDS and eight nodes twice (about 90 s)")
	}
	etcd, bin := clusterBins(t)
	trace := "../../../testdata/traces/conversation_trace.jsonl.gz"
	runOnce := func(hot bool) replayReport {
		args := []string{"replay", "--bin", bin, "--etcd", etcd, "--nodes", "8", "--clients", "8", "--limit", "1500",
			"--trace", trace, "--node-cap", "32MiB", "--max-time", "4m", "--json",
			// The replay at this size lasts ~7 s: with the default 1 s interval the time before
			// the first replicas is a seventh of the run, and the ratio followed the machine's
			// speed (1.08 to 1.31 on an idle machine); 250 ms keeps that share small.
			"--hot-interval", "250ms"}
		if hot {
			args = append(args, "--hot")
		}
		var out, errb bytes.Buffer
		rc := run(args, &out, &errb)
		if rc != 0 {
			t.Fatalf("replay (hot %v) exit %d\n%s\n%s", hot, rc, out.String(), tail(errb.String(), 40))
		}
		var rep replayReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("report: %v\n%s", err, out.String())
		}
		t.Logf("hot %v: busiest/mean %.3f, hit ratio %.4f, replicas made %.0f, replica reads %.0f (misses %.0f), %.1f s",
			hot, rep.BusiestOver, rep.HitRatio, rep.ReplicasMade, rep.ReplicaReads, rep.ReplicaMisses, rep.Seconds)
		return rep
	}
	off, on := runOnce(false), runOnce(true)
	if on.BusiestOver > 1.25 {
		t.Errorf("busiest/mean %.3f with spreading (%.3f without), want <= 1.25", on.BusiestOver, off.BusiestOver)
	}
	if on.HitRatio < 0.98*off.HitRatio {
		t.Errorf("hit ratio %.4f with spreading, want >= 0.98 x %.4f", on.HitRatio, off.HitRatio)
	}
	if on.ReplicasMade == 0 {
		t.Error("no replica made")
	}
}
