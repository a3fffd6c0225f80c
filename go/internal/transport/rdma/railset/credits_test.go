package railset

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// orderRails: primary first, then NUMA-local rails, then the others, each group rotated
// round robin; NUMA off (node < 0) or unknown nodes make every rail "other".
func TestOrderRails(t *testing.T) {
	nodes := map[string]int{"r0": 0, "r1": 1, "r2": 0, "r3": 1, "r4": -1}
	for _, tc := range []struct {
		name    string
		cands   []string
		primary string
		rr      uint32
		node    int
		want    []string
	}{
		{"numa off", []string{"r0", "r1", "r2", "r3"}, "", 0, -1, []string{"r0", "r1", "r2", "r3"}},
		{"numa off rotated", []string{"r0", "r1", "r2", "r3"}, "", 1, -1, []string{"r1", "r2", "r3", "r0"}},
		{"node 1 first", []string{"r0", "r1", "r2", "r3"}, "", 0, 1, []string{"r1", "r3", "r0", "r2"}},
		{"node 1 rotated", []string{"r0", "r1", "r2", "r3"}, "", 1, 1, []string{"r3", "r1", "r2", "r0"}},
		{"node 0", []string{"r0", "r1", "r2", "r3"}, "", 0, 0, []string{"r0", "r2", "r1", "r3"}},
		{"primary beats locality", []string{"r0", "r1", "r2", "r3"}, "r0", 0, 1, []string{"r0", "r1", "r3", "r2"}},
		{"unknown node is not local", []string{"r4", "r1"}, "", 0, -1, []string{"r4", "r1"}},
		{"unknown node after local", []string{"r4", "r1"}, "", 0, 1, []string{"r1", "r4"}},
		{"no local rail in the tier", []string{"r0", "r2"}, "", 0, 1, []string{"r0", "r2"}},
		{"one rail", []string{"r3"}, "", 7, 0, []string{"r3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, orderRails(tc.cands, tc.primary, tc.rr, tc.node, nodes)); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestRailCreditsBudget(t *testing.T) {
	var rc railCredits
	if !rc.tryTake("a", 2) || !rc.tryTake("a", 2) {
		t.Fatal("budget 2 refused")
	}
	if rc.tryTake("a", 2) {
		t.Fatal("third credit of a budget of 2")
	}
	if !rc.tryTake("b", 2) {
		t.Fatal("rails share a budget")
	}
	w := rc.waitCh()
	select {
	case <-w:
		t.Fatal("woken before a release")
	default:
	}
	rc.release("a")
	select {
	case <-w:
	default:
		t.Fatal("release did not wake waiters")
	}
	if rc.used("a") != 1 || !rc.tryTake("a", 2) {
		t.Fatalf("after release: %d in use", rc.used("a"))
	}
	rc.release("c") // never taken: stays at zero
	if rc.used("c") != 0 {
		t.Fatal("negative credits")
	}
}

// splitReplay: reads always replay; writes only when never posted.
func TestSplitReplay(t *testing.T) {
	get := &onesided.Op{Kind: fb.OpGet, Posted: true}
	exist := &onesided.Op{Kind: fb.OpExist}
	putPosted := &onesided.Op{Kind: fb.OpPut, Posted: true}
	putNot := &onesided.Op{Kind: fb.OpPut}
	rmPosted := &onesided.Op{Kind: fb.OpRemove, Posted: true}
	rmNot := &onesided.Op{Kind: fb.OpRemove}
	replay, amb := splitReplay([]*onesided.Op{get, putPosted, exist, putNot, rmPosted, rmNot})
	if amb != 2 || len(replay) != 4 || replay[0] != get || replay[1] != exist || replay[2] != putNot || replay[3] != rmNot {
		t.Fatalf("replay %v, ambiguous %d", replay, amb)
	}
}

// published is a server's rail record the tests change (an in-memory stand-in for the MDS
// topology).
type published struct {
	mu    sync.Mutex
	rails []wire.Rail
}

func (m *published) get(string) []wire.Rail {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.rails)
}

func (m *published) set(rails []wire.Rail) {
	m.mu.Lock()
	m.rails = rails
	m.mu.Unlock()
}

// testErrors map as go/client's do: a deadline that ends a wait is a timeout too.
var testErrors = Errors{Invalid: errInvalid, Timeout: errTimeout, Ctx: func(addr string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w: %w", addr, errTimeout, err)
	}
	return fmt.Errorf("%s: %w", addr, err)
}}

// testHost is a server that never serves RDMA; it counts the health verdicts.
type testHost struct {
	addr            string
	healthy, failed atomic.Int32
}

func (h *testHost) Addr() string { return h.addr }
func (h *testHost) Bootstrap(context.Context) (net.Conn, error) {
	return nil, errors.New("no server in this test")
}
func (h *testHost) MarkHealthy() { h.healthy.Add(1) }
func (h *testHost) MarkFailed()  { h.failed.Add(1) }

// acquireRail: a tier-0 rail out of credits makes the op wait (never tier 1); a release
// wakes it onto tier 0; a deadline that runs out is Timeout; only health (a quarantine of
// every tier-0 rail) moves it to tier 1.
func TestAcquireRailBackpressure(t *testing.T) {
	healthy := func(d string) wire.Rail { return wire.Rail{Device: d, Port: 1, Health: fb.RailHealthHealthy} }
	ms := &published{rails: []wire.Rail{healthy("a"), healthy("b")}}
	s, err := New(Options{PoolSize: 16, IOTimeout: 5 * time.Second, Published: ms.get, Errors: testErrors,
		Provider: "soft", Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}, {"b"}}, RailCredits: 1, RailProbeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := s.NewPeer(&testHost{addr: "127.0.0.1:1"})
	ctx := context.Background()
	rail, err := p.acquireRail(ctx)
	if err != nil || rail != "a" {
		t.Fatalf("first: %q %v", rail, err)
	}
	// a is at its budget: a short deadline times out rather than taking b.
	sctx, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	rail, err = p.acquireRail(sctx)
	cancel()
	if !errors.Is(err, errTimeout) || rail != "" {
		t.Fatalf("out of credits: %q %v (want Timeout, no rail)", rail, err)
	}
	// A waiter gets a when the holder gives it back.
	got := make(chan string, 1)
	go func() {
		r, err := p.acquireRail(ctx)
		if err != nil {
			r = err.Error()
		}
		got <- r
	}()
	select {
	case r := <-got:
		t.Fatalf("took %q while a was busy", r)
	case <-time.After(100 * time.Millisecond):
	}
	p.releaseRail("a")
	if r := <-got; r != "a" {
		t.Fatalf("after the release: %q", r)
	}
	if n := p.px.credits.used("b"); n != 0 {
		t.Fatalf("tier 1 credits taken: %d", n)
	}
	// Health, not congestion, moves tiers: a quarantined, the op goes to b at once.
	p.quarantine("a", time.Minute)
	if rail, err := p.acquireRail(ctx); err != nil || rail != "b" {
		t.Fatalf("tier 0 quarantined: %q %v", rail, err)
	}
	// Published unhealthy everywhere: no compatible rail (client-local, no wait).
	ms.set([]wire.Rail{{Device: "a", Health: fb.RailHealthDown}, {Device: "b", Health: fb.RailHealthDown}})
	if _, err := p.acquireRail(ctx); !errors.Is(err, ErrNoCompatibleRail) {
		t.Fatalf("nothing usable: %v", err)
	}
}
