package e2e

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Per-rail latency end to end (docs/RDMA.md §4, "Latency"): tiers soft0,soft1;soft2 on a
// real dfkv_server registered with a real dfkv_mds. The client's soft1 completes every
// send 100 ms late (its own fault file). Once both tier-0 rails have enough samples, soft1
// is demoted: most ops go to soft0, soft1 still gets a few, tier 1 (soft2) and TCP get
// none, and the server is not cooled. When the delay clears, soft1's EWMA comes down, the
// demotion ends and soft1 carries its round-robin share again.
func TestRDMARailsLatencyDemotion(t *testing.T) {
	softOnly(t)
	const slowRail, fastRail, tier1 = "soft1", "soft0", "soft2"
	r := startRailRig(t, "e2e-crails-lat", "--rdma-dev", "soft0,soft1,soft2", "--rdma-tiers", "soft0,soft1;soft2")
	faults := filepath.Join(r.dir, "client-faults")
	if err := soft.WriteFaults(faults, slowRail+" delay 100ms\n"); err != nil {
		t.Fatal(err)
	}
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1", "soft2"},
		Tiers: [][]string{{"soft0", "soft1"}, {"soft2"}}})
	ops := func(rail string) float64 { return clientRail(t, c, "dfkv_rdma_client_rail_ops_total", rail) }
	round := 0
	// runUntil runs PUT+GET rounds (4 KiB, bytes checked) until cond holds, at most max.
	runUntil := func(what string, max int, cond func() bool) {
		t.Helper()
		for i := 0; !cond(); i++ {
			if i == max {
				t.Fatalf("%s: not after %d rounds (soft0 %v ops, soft1 %v ops)", what, max, ops(fastRail), ops(slowRail))
			}
			putGetRound(t, c, "lat"+strconv.Itoa(round)+"-", 1, 4096, uint64(round))
			round++
		}
	}

	runUntil("soft1 demoted", 100, func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_latency_demotions_total", slowRail) >= 1
	})
	fast0, slow0 := ops(fastRail), ops(slowRail)
	const rounds = 60 // 120 ops
	n := 0
	runUntil("the demoted phase", rounds, func() bool { n++; return n > rounds })
	fastN, slowN := ops(fastRail)-fast0, ops(slowRail)-slow0
	if fastN+slowN != 2*rounds {
		t.Fatalf("tier 0 carried %v ops, want %d", fastN+slowN, 2*rounds)
	}
	// Round robin would give soft1 half (60); demoted it gets about one pick in eight.
	if slowN < 1 || slowN > 2*rounds/4 {
		t.Fatalf("demoted soft1 carried %v of %d ops (want a small share, at least one)", slowN, 2*rounds)
	}
	if got := clientRail(t, c, "dfkv_rdma_client_rail_latency_seconds_count", slowRail); got < 1 {
		t.Fatalf("no latency samples exported for soft1 (%v)", got)
	}
	if n := ops(tier1) + clientRail(t, c, "dfkv_rdma_client_rail_conns_opened_total", tier1); n != 0 {
		t.Fatalf("latency moved traffic to tier 1 (%v ops + conns)", n)
	}
	if n := railMetric(t, r.s, "dfkv_rdma_rail_conns_opened_total", tier1); n != 0 {
		t.Fatalf("server %s served %v connections", tier1, n)
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 0 {
		t.Fatalf("%v PUT/GET over TCP", n)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
		t.Fatalf("latency cooled the server (%v)", n)
	}

	// The delay clears: soft1's share of picks brings its EWMA down and ends the demotion.
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	runUntil("soft1 restored", 400, func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_latency_restores_total", slowRail) >= 1
	})
	fast0, slow0 = ops(fastRail), ops(slowRail)
	n = 0
	runUntil("the restored phase", 40, func() bool { n++; return n > 40 })
	fastN, slowN = ops(fastRail)-fast0, ops(slowRail)-slow0
	// A demoted rail gets about 80/8 = 10; round robin gives 40. A rail that is re-demoted by one
	// noisy sample for part of the phase (no hysteresis yet) still lands well above 10.
	if slowN < 80/5 {
		t.Fatalf("restored soft1 carried %v of 80 ops (soft0 %v): want its round-robin share back", slowN, fastN)
	}
	if n := ops(tier1); n != 0 {
		t.Fatalf("tier 1 carried %v ops", n)
	}
}
