package e2e

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Rails, part 2, end to end (docs/RDMA.md §4): per-rail credits and backpressure inside a
// tier, quarantine → probing → recovery, the replay contract for batches, generation
// fencing after a reconnect, NUMA-local preference, over two and four soft rails of a real
// dfkv_server registered with a real dfkv_mds.

var fourRails = []string{"soft0", "soft1", "soft2", "soft3"}

func railSum(t *testing.T, c *client.Client, name string, rails []string) float64 {
	t.Helper()
	var n float64
	for _, r := range rails {
		n += clientRail(t, c, name, r)
	}
	return n
}

// Four healthy tier-0 rails: sequential traffic spreads over every one of them (ops,
// bytes, connections on both ends); credits all given back afterwards. A second client
// with NUMA on (its soft NICs on nodes 0,1,0,1, the caller on node 1) keeps to soft1 and
// soft3.
func TestRDMARailsFourSpreadAndNUMA(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-f", "--rdma-dev", "soft0,soft1,soft2,soft3")
	c := r.client(t, client.RDMAOptions{Devices: fourRails})
	putGetRound(t, c, "f", 16, 70000, 1)
	for _, rail := range fourRails {
		ops, by := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", rail), clientRail(t, c, "dfkv_rdma_client_rail_bytes_total", rail)
		if ops < 4 || by < 4*70000 || clientRail(t, c, "dfkv_rdma_client_rail_conns_opened_total", rail) < 1 {
			t.Errorf("rail %s: %v ops, %v bytes (want the 32 ops spread over four rails)", rail, ops, by)
		}
		if n := railMetric(t, r.s, "dfkv_rdma_rail_conns_opened_total", rail); n < 1 {
			t.Errorf("server rail %s served %v connections", rail, n)
		}
		if n := clientRail(t, c, "dfkv_rdma_client_rail_credits_in_use", rail); n != 0 {
			t.Errorf("rail %s: %v credits still in use", rail, n)
		}
	}
	if got := railSum(t, c, "dfkv_rdma_client_rail_bytes_total", fourRails); got != 32*70000 {
		t.Errorf("%v bytes over the rails, want %d", got, 32*70000)
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 0 {
		t.Errorf("%v PUT/GET requests over TCP", n)
	}

	cn := r.client(t, client.RDMAOptions{Devices: fourRails, NUMA: true, NUMANode: 1, SoftNUMANodes: []int{0, 1, 0, 1}})
	putGetRound(t, cn, "fn", 8, 30000, 50)
	for _, rail := range fourRails {
		ops := clientRail(t, cn, "dfkv_rdma_client_rail_ops_total", rail)
		if local := rail == "soft1" || rail == "soft3"; local != (ops > 0) {
			t.Errorf("NUMA node 1: %v ops on %s", ops, rail)
		}
	}
	if got := railSum(t, cn, "dfkv_rdma_client_rail_ops_total", fourRails); got != 16 {
		t.Errorf("%v ops over the rails, want 16", got)
	}
}

// Congestion on tier 0 (two rails, one credit each, eight writers) makes ops wait for a
// credit; it never produces tier-1 traffic, nor TCP. An op whose deadline runs out while
// every tier-0 credit is held fails with a timeout, again without touching tier 1, and the
// server is not cooled.
func TestRDMARailsCongestionStaysInTier(t *testing.T) {
	softOnly(t)
	for _, tc := range []struct {
		name         string
		tier0, tier1 []string
	}{
		{"two-rails", []string{"soft0"}, []string{"soft1"}},
		{"four-rails", []string{"soft0", "soft1"}, []string{"soft2", "soft3"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testCongestionStaysInTier(t, tc.tier0, tc.tier1) })
	}
}

func testCongestionStaysInTier(t *testing.T, tier0, tier1 []string) {
	all := append(append([]string(nil), tier0...), tier1...)
	r := startRailRig(t, "e2e-crails-g"+strconv.Itoa(len(all)), "--rdma-dev", strings.Join(all, ","),
		"--rdma-tiers", strings.Join(tier0, ",")+";"+strings.Join(tier1, ","))
	c := r.client(t, client.RDMAOptions{Devices: all, Tiers: [][]string{tier0, tier1}, RailCredits: 1, Depth: 2})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				k, v := []byte("g"+strconv.Itoa(g)+"-"+strconv.Itoa(i)), rnd(512<<10, uint64(g*10+i))
				if err := c.Put(ctx, k, v); err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(v))
				if err := c.Get(ctx, k, got); err != nil || !bytes.Equal(got, v) {
					errs <- errors.Join(err, errors.New("wrong bytes"))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if w := railSum(t, c, "dfkv_rdma_client_rail_credit_waits_total", all); w < 1 {
		t.Fatalf("eight writers on one-credit rails never waited (%v): no congestion tested", w)
	}
	if n := railSum(t, c, "dfkv_rdma_client_rail_ops_total", tier1) + railSum(t, c, "dfkv_rdma_client_rail_conns_opened_total", tier1); n != 0 {
		t.Fatalf("congestion on tier 0 produced tier-1 traffic (%v ops + conns)", n)
	}
	for _, rail := range tier1 {
		if n := railMetric(t, r.s, "dfkv_rdma_rail_conns_opened_total", rail); n != 0 {
			t.Fatalf("server %s served %v connections", rail, n)
		}
	}
	if got := railSum(t, c, "dfkv_rdma_client_rail_ops_total", tier0); got != 80 {
		t.Fatalf("tier 0 carried %v ops, want 80", got)
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 0 {
		t.Fatalf("%v PUT/GET over TCP", n)
	}

	// Hold every tier-0 credit with slow batches (the client's tier-0 send completions are
	// delayed 150 ms each, so a chunk of 20 GETs fills its send queue and crawls), then an
	// op with a short deadline: it times out waiting; it never takes a tier-1 rail.
	items := make([]client.Item, 80)
	for i := range items {
		items[i] = client.Item{Key: []byte("gh" + strconv.Itoa(i)), Value: rnd(16<<10, uint64(500+i))}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	faults := filepath.Join(r.dir, "client-faults")
	slow := ""
	for _, rail := range tier0 {
		slow += rail + " delay 150ms\n"
	}
	if err := soft.WriteFaults(faults, slow); err != nil {
		t.Fatal(err)
	}
	used := func() float64 {
		return railSum(t, c, "dfkv_rdma_client_rail_credits_in_use", tier0)
	}
	var bg sync.WaitGroup
	for range len(tier0) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			gets := make([]client.Item, len(items))
			for i := range gets {
				gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, len(items[i].Value))}
			}
			if err := c.BatchGet(ctx, gets, client.Exact); err != nil {
				t.Errorf("slow batch: %v", err)
			}
		}()
	}
	waitFor(t, 10*time.Second, "every tier-0 credit held", func() bool { return used() == float64(len(tier0)) })
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := c.Put(sctx, []byte("g-late"), rnd(1000, 1))
	cancel()
	if !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("put while tier 0 is out of credits: %v (want a timeout)", err)
	}
	bg.Wait()
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	if n := railSum(t, c, "dfkv_rdma_client_rail_ops_total", tier1); n != 0 {
		t.Fatalf("the timed-out op spilled to tier 1 (%v ops)", n)
	}
	if n := r.s.requests(fb.OpPut); n != 0 {
		t.Fatalf("the timed-out op went over TCP (%v)", n)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
		t.Fatalf("congestion cooled the server (%v)", n)
	}
	if n := used(); n != 0 {
		t.Fatalf("%v credits in use after everything finished", n)
	}
}

// A four-rail client, primary soft0, depth 2: a completion error in the middle of a batch
// GET quarantines soft0 and only the unfinished items are replayed (byte-exact) on another
// rail; soft0's port going down in the middle of a batch PUT returns the items possibly
// submitted (at most a window) as errors without replay and replays the never-posted rest
// on another rail. While the port is down the probes of soft0 fail; once it is up (with an
// injected late completion of an old QP generation waiting for the next QP) a probe
// recovers soft0 — the stale completion is dropped and counted — and traffic returns to it.
func TestRDMARailsFailMidBatchProbeRecover(t *testing.T) {
	softOnly(t)
	for _, rails := range [][]string{fourRails[:2], fourRails} {
		t.Run(strconv.Itoa(len(rails))+"-rails", func(t *testing.T) { testFailMidBatchProbeRecover(t, rails) })
	}
}

func testFailMidBatchProbeRecover(t *testing.T, rails []string) {
	r := startRailRig(t, "e2e-crails-h"+strconv.Itoa(len(rails)), "--rdma-dev", strings.Join(rails, ","))
	c := r.client(t, client.RDMAOptions{Devices: rails, Primary: "soft0", Depth: 2,
		RailQuarantine: time.Minute, RailProbeInterval: 100 * time.Millisecond})
	faults := filepath.Join(r.dir, "client-faults")
	others := rails[1:]
	ctx := context.Background()
	const n, size = 32, 1 << 20
	items := make([]client.Item, n)
	for i := range items {
		items[i] = client.Item{Key: []byte("h" + strconv.Itoa(i)), Value: rnd(size, uint64(700+i))}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	if got := railSum(t, c, "dfkv_rdma_client_rail_ops_total", others); got != 0 {
		t.Fatalf("primary healthy, yet %v ops elsewhere", got)
	}

	// (1) Completion error mid batch GET (odd items scattered into three segments).
	gets := make([]client.Item, n)
	for i := range gets {
		gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, size)}
		if i%2 == 1 {
			gets[i] = client.Item{Key: items[i].Key, Segs: [][]byte{make([]byte, 300000), make([]byte, 400000), make([]byte, size-700000)}}
		}
	}
	soft0Ops := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0")
	others0 := railSum(t, c, "dfkv_rdma_client_rail_ops_total", others)
	// soft0's 7th send WR from now fails: the error lands in the middle of the batch, after
	// some of its requests went out (and may have completed) on soft0, without racing it.
	if err := soft.WriteFaults(faults, "soft0 comp_err 1 after 6\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.BatchGet(ctx, gets, client.Exact) }()
	if err := <-done; err != nil {
		t.Fatalf("batch get: %v", err)
	}
	for i := range gets {
		got := gets[i].Buf
		if gets[i].Segs != nil {
			got = bytes.Join(gets[i].Segs, nil)
		}
		if gets[i].Err != nil || !bytes.Equal(got, items[i].Value) {
			t.Fatalf("item %d: %v, equal %v", i, gets[i].Err, bytes.Equal(got, items[i].Value))
		}
	}
	// Every item completed exactly once over RDMA: on soft0, or elsewhere after soft0 broke
	// (replayed, or SG items no lane connection had started yet, which go to the next rail
	// as fresh requests). An item completed on soft0 and then replayed would make the sum
	// exceed n.
	replayed := railSum(t, c, "dfkv_rdma_client_rail_replayed_ops_total", others)
	onSoft0 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0") - soft0Ops
	onOthers := railSum(t, c, "dfkv_rdma_client_rail_ops_total", others) - others0
	if replayed < 1 || replayed > onOthers || onSoft0+onOthers != n {
		t.Fatalf("%v GETs replayed, %v completed on soft0, %v on the other rails; want each item once (sum %d), the unfinished ones replayed",
			replayed, onSoft0, onOthers, n)
	}
	if q, e := clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", "soft0"), clientRail(t, c, "dfkv_rdma_client_rail_completion_errors_total", "soft0"); q != 1 || e != 1 {
		t.Fatalf("soft0: %v quarantines, %v completion errors (want 1, 1)", q, e)
	}
	// The comp_err was used up: a probe recovers soft0 on its own.
	waitFor(t, 10*time.Second, "soft0 recovered by a probe", func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_recoveries_total", "soft0") == 1
	})

	// (2) Port down mid batch PUT.
	puts := make([]client.Item, n)
	for i := range puts {
		puts[i] = client.Item{Key: []byte("hp" + strconv.Itoa(i)), Value: rnd(size, uint64(900+i))}
	}
	written := r.s.metric("dfkv_rdma_v2_put_writes_total")
	replayed0 := railSum(t, c, "dfkv_rdma_client_rail_replayed_ops_total", others)
	soft0Ops = clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0")
	// Slow soft0's completions so that the port goes down while the chunks are in flight.
	if err := soft.WriteFaults(faults, "soft0 delay 100ms\n"); err != nil {
		t.Fatal(err)
	}
	go func() { done <- c.BatchPut(ctx, puts) }()
	waitFor(t, 30*time.Second, "the batch PUT under way", func() bool { return r.s.metric("dfkv_rdma_v2_put_writes_total") >= written+4 })
	if err := soft.WriteFaults(faults, "soft0 port down\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("batch put: %v (items carry their own errors)", err)
	}
	failed := 0
	for i := range puts {
		if puts[i].Err != nil {
			failed++
			continue
		}
		got := make([]byte, size)
		if err := c.Get(ctx, puts[i].Key, got); err != nil || !bytes.Equal(got, puts[i].Value) {
			t.Fatalf("put item %d reported stored: %v, equal %v", i, err, bytes.Equal(got, puts[i].Value))
		}
	}
	amb := clientRail(t, c, "dfkv_rdma_client_rail_ambiguous_writes_total", "soft0")
	// Each of the batch's chunks (BatchConcurrency 4, all on soft0) had at most a window
	// (depth 2) posted when its connection broke.
	if failed < 1 || failed > 2*4 || float64(failed) != amb {
		t.Fatalf("port down mid batch PUT: %d items failed, %v ambiguous (want 1..8, equal)", failed, amb)
	}
	for i := range puts {
		if puts[i].Err != nil && !errors.Is(puts[i].Err, client.ErrUnavailable) {
			t.Fatalf("ambiguous item %d: %v (want the connection's error)", i, puts[i].Err)
		}
	}
	// Every item is exactly one of: completed on soft0, ambiguous (failed), replayed.
	onSoft0 = clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0") - soft0Ops
	if got := railSum(t, c, "dfkv_rdma_client_rail_replayed_ops_total", others) - replayed0; got < 1 || got+onSoft0+float64(failed) != n {
		t.Fatalf("%v PUTs replayed, %v completed on soft0, %d ambiguous; want the never-posted ones only (sum %d)", got, onSoft0, failed, n)
	}
	if got := r.s.requests(fb.OpPut) + r.s.requests(fb.OpBatchPut) + r.s.requests(fb.OpGet) + r.s.requests(fb.OpBatchGet); got != 0 {
		t.Fatalf("%v requests over TCP", got)
	}

	// (3) Probes fail while the port is down; soft0 stays out of service.
	probes := clientRail(t, c, "dfkv_rdma_client_rail_probes_total", "soft0")
	waitFor(t, 10*time.Second, "two failed probes of soft0", func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_probes_total", "soft0") >= probes+2
	})
	ops0 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0")
	putGetRound(t, c, "h3", 3, 20000, 40)
	if got := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0"); got != ops0 || clientRail(t, c, "dfkv_rdma_client_rail_recoveries_total", "soft0") != 1 {
		t.Fatalf("soft0 used (%v ops) or recovered while its port is down", got-ops0)
	}

	// (4) The port comes back with a late completion of an old generation queued for the
	// next QP: the probe's fresh connection drops it, and soft0 recovers.
	if err := soft.WriteFaults(faults, "soft0 stale_wc 1\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "soft0 recovered again", func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_recoveries_total", "soft0") == 2
	})
	if got := clientRail(t, c, "dfkv_rdma_client_rail_stale_completions_total", "soft0"); got != 1 {
		t.Fatalf("stale completions dropped on soft0: %v, want 1", got)
	}
	others0 = railSum(t, c, "dfkv_rdma_client_rail_ops_total", others)
	putGetRound(t, c, "h4", 3, 20000, 60)
	if got := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0"); got < ops0+6 {
		t.Fatalf("after recovery soft0 carried %v of 6 ops", got-ops0)
	}
	if got := railSum(t, c, "dfkv_rdma_client_rail_ops_total", others); got != others0 {
		t.Fatalf("primary recovered, yet %v ops elsewhere", got-others0)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
		t.Fatalf("rail failures cooled the server (%v) while other rails were healthy", n)
	}
}
