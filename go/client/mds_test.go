package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/mds"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

type testMDS struct {
	store *mds.MemStore
	svc   *mds.Service
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestMDS(t *testing.T) *testMDS {
	t.Helper()
	st := mds.NewMemStore()
	svc, err := mds.NewService(mds.Config{Store: st, LeaseTTL: time.Hour, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	return &testMDS{store: st, svc: svc}
}

// replica starts one MDS listener over the shared store; the returned func stops it.
func (m *testMDS) replica(t *testing.T) (string, func()) {
	t.Helper()
	srv, err := mds.NewServer(mds.ServerConfig{Service: m.svc, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

func (m *testMDS) set(t *testing.T, ids ...string) {
	t.Helper()
	ctx := context.Background()
	topo, _ := m.svc.Topology(ctx, "g")
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
		r := m.svc.Handle(ctx, &wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g",
			Member: &wire.Member{ID: id, Addr: "127.0.0.1:1" + id[1:], Weight: 1, Eligible: true}})
		if r.Status != fb.StatusOk {
			t.Fatalf("register %s: %+v", id, r)
		}
	}
	for _, mm := range topo.Members {
		if !want[mm.ID] {
			m.svc.Handle(ctx, &wire.MdsRequest{Op: fb.MdsOpDeregisterMember, Group: "g", Member: &wire.Member{ID: mm.ID}})
		}
	}
}

func ids(v *View) []string {
	var out []string
	for _, m := range v.Members {
		out = append(out, m.ID)
	}
	return out
}

func newMembership(t *testing.T, o MDSOptions) *MDSMembership {
	t.Helper()
	o.Group, o.Logger = "g", quietLog()
	if o.Poll == 0 {
		o.Poll = time.Hour // tests drive polls by hand
		if o.LongPoll == 0 {
			o.LongPoll = -1
		}
	}
	o.CallTimeout = 500 * time.Millisecond
	m, err := NewMDSMembership(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func pollOnce(t *testing.T, m *MDSMembership) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := m.poll(ctx, 0)
	return err
}

func TestMDSMembershipFollowsEpoch(t *testing.T) {
	srv := newTestMDS(t)
	addr, _ := srv.replica(t)
	srv.set(t, "n1", "n2", "n3")
	m := newMembership(t, MDSOptions{Endpoints: []string{addr}})
	v1 := m.View()
	if got := ids(v1); len(got) != 3 {
		t.Fatalf("initial view %v", got)
	}
	pollOnce(t, m)
	if m.View() != v1 {
		t.Fatal("an unchanged MembersEpoch must keep the same view")
	}
	srv.set(t, "n1", "n2", "n3", "n4")
	pollOnce(t, m)
	if got := ids(m.View()); len(got) != 4 || m.View().Epoch == v1.Epoch {
		t.Fatalf("grown view %v", got)
	}
	// A one-of-four shrink is not guarded.
	srv.set(t, "n1", "n2", "n3")
	pollOnce(t, m)
	if got := ids(m.View()); len(got) != 3 {
		t.Fatalf("after removing one: %v", got)
	}
	// Ineligible members are not in the ring.
	srv.svc.Handle(context.Background(), &wire.MdsRequest{Op: fb.MdsOpHeartbeatMember, Group: "g",
		Member: &wire.Member{ID: "n3", Addr: "127.0.0.1:13", Weight: 1, Eligible: false}})
	pollOnce(t, m)
	if got := ids(m.View()); len(got) != 2 {
		t.Fatalf("ineligible member routed: %v", got)
	}
}

func TestMDSMembershipShrinkGuard(t *testing.T) {
	tests := []struct {
		name       string
		polls      int
		transient  bool
		wantShrunk bool
	}{
		{"persistent shrink adopted at the Nth poll", 3, false, true},
		{"transient shrink never adopted", 3, true, false},
		{"guard off", 1, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newTestMDS(t)
			addr, _ := srv.replica(t)
			srv.set(t, "n1", "n2", "n3")
			m := newMembership(t, MDSOptions{Endpoints: []string{addr}, ShrinkPolls: tt.polls})
			srv.set(t, "n1")
			for i := 1; i < tt.polls; i++ {
				pollOnce(t, m)
				if got := ids(m.View()); len(got) != 3 {
					t.Fatalf("poll %d: shrink adopted early: %v", i, got)
				}
			}
			if tt.transient {
				srv.set(t, "n1", "n2", "n3")
			}
			pollOnce(t, m)
			if shrunk := len(m.View().Members) == 1; shrunk != tt.wantShrunk {
				t.Fatalf("after %d polls: view %v", tt.polls, ids(m.View()))
			}
			if tt.transient {
				// The streak was reset: a new shrink needs N fresh polls again.
				srv.set(t, "n1")
				pollOnce(t, m)
				if len(m.View().Members) != 3 {
					t.Fatal("shrink streak not reset by the recovery")
				}
			}
		})
	}
}

// A loss spread over two polls (leases expiring one etcd sweep apart) is judged as one.
func TestMDSMembershipShrinkGuardStaggered(t *testing.T) {
	srv := newTestMDS(t)
	addr, _ := srv.replica(t)
	srv.set(t, "n1", "n2", "n3")
	m := newMembership(t, MDSOptions{Endpoints: []string{addr}, ShrinkPolls: 3})
	srv.set(t, "n1", "n2")
	pollOnce(t, m)
	if len(m.View().Members) != 2 {
		t.Fatal("losing one of three is not guarded")
	}
	srv.set(t, "n1")
	for i := 1; i < 3; i++ {
		pollOnce(t, m)
		if got := ids(m.View()); len(got) != 2 {
			t.Fatalf("poll %d: staggered shrink adopted early: %v", i, got)
		}
	}
	pollOnce(t, m)
	if got := ids(m.View()); len(got) != 1 {
		t.Fatalf("persistent staggered shrink not adopted: %v", got)
	}
	// The adopted shrink is the new reference: growing back and losing one is not guarded.
	srv.set(t, "n1", "n2")
	pollOnce(t, m)
	srv.set(t, "n2")
	pollOnce(t, m)
	if got := ids(m.View()); len(got) != 1 || got[0] != "n2" {
		t.Fatalf("after regrowth: %v", got)
	}
}

func TestMDSMembershipKeepsLastGoodAndFailsOver(t *testing.T) {
	srv := newTestMDS(t)
	a, stopA := srv.replica(t)
	b, stopB := srv.replica(t)
	srv.set(t, "n1", "n2")
	m := newMembership(t, MDSOptions{Endpoints: []string{a, b}})
	if len(m.View().Members) != 2 {
		t.Fatal("no initial view")
	}
	stopA()
	srv.set(t, "n1", "n2", "n3")
	if err := pollOnce(t, m); err != nil || len(m.View().Members) != 3 {
		t.Fatalf("failover to the second replica: %v %v", err, ids(m.View()))
	}
	// etcd down: the replica answers IOError; the ring stays.
	srv.store.SetDown(true)
	if err := pollOnce(t, m); err == nil || len(m.View().Members) != 3 {
		t.Fatalf("etcd down: %v %v", err, ids(m.View()))
	}
	srv.store.SetDown(false)
	stopB()
	if err := pollOnce(t, m); err == nil || len(m.View().Members) != 3 {
		t.Fatalf("no replica: %v %v", err, ids(m.View()))
	}
}

func TestMDSMembershipNoMDSAtOpen(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	start := time.Now()
	m := newMembership(t, MDSOptions{Endpoints: []string{dead}, InitialWait: time.Second})
	if time.Since(start) > 3*time.Second {
		t.Fatal("open waited too long for an absent MDS")
	}
	c, err := New(Options{Membership: m, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); !IsMiss(err) {
		t.Fatalf("empty ring must be a miss, got %v", err)
	}
	if snap := string(c.Snapshot()); !strings.Contains(snap, "dfkv_client_mds_polls_total") {
		t.Fatal("membership metrics missing from the client snapshot")
	}
}

func TestClientRegistration(t *testing.T) {
	srv := newTestMDS(t)
	addr, _ := srv.replica(t)
	list := func() []wire.ClientInfo {
		c, err := srv.svc.Clients(context.Background(), "g")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	waitFor := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(list()) != n {
			if time.Now().After(deadline) {
				t.Fatalf("clients %v, want %d", list(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	m := newMembership(t, MDSOptions{Endpoints: []string{addr}, Register: true, ClientID: "conn-1",
		Info: []wire.KV{{Key: "engine", Value: "sglang"}}, Heartbeat: 50 * time.Millisecond})
	waitFor(1)
	if c := list()[0]; c.ID != "conn-1" || c.Info[0].Value != "sglang" || c.PID == 0 {
		t.Fatalf("registered %+v", c)
	}
	if topo, _ := srv.svc.Topology(context.Background(), "g"); len(topo.Members) != 0 {
		t.Fatal("a client entered the ring")
	}
	m.Close()
	waitFor(0)

	// The environment is the C ABI's business (TestRegisterEnv there): the library obeys
	// only its options, so DFKV_CLIENT_REGISTER=0 here changes nothing.
	t.Setenv("DFKV_CLIENT_REGISTER", "0")
	m2 := newMembership(t, MDSOptions{Endpoints: []string{addr}, Register: false, ClientID: "conn-2"})
	// No holder means nothing can ever register; no sleep-and-hope needed.
	if m2.holder != nil {
		t.Fatal("Register false still started a registration holder")
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("Register false still registered: %+v", got)
	}
	m3 := newMembership(t, MDSOptions{Endpoints: []string{addr}, Register: true, ClientID: "conn-3"})
	waitFor(1)
	m3.Close()
	waitFor(0)
}

// stalledMDS accepts connections and reads requests but never answers. Each request read
// is reported on the returned channel.
func stalledMDS(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 64)
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			go func() {
				var hdr [wire.RequestSize]byte
				for {
					if _, err := io.ReadFull(nc, hdr[:]); err != nil {
						return
					}
					r, err := wire.DecodeRequest(hdr[:])
					if err != nil || r.PayloadLen > 1<<20 {
						return
					}
					if _, err := io.CopyN(io.Discard, nc, int64(r.PayloadLen)); err != nil {
						return
					}
					got <- struct{}{}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range conns {
			nc.Close()
		}
	})
	return ln.Addr().String(), got
}

// Close returns promptly while a poll (and a registration) waits on an MDS that stopped
// answering, although each call may take a minute: Close interrupts them and joins the
// poll loop.
func TestMDSMembershipCloseInterruptsStalledPoll(t *testing.T) {
	for _, register := range []bool{false, true} {
		t.Run(fmt.Sprintf("register=%v", register), func(t *testing.T) {
			addr, inflight := stalledMDS(t)
			m, err := NewMDSMembership(MDSOptions{Endpoints: []string{addr}, Group: "g", Logger: quietLog(),
				Poll: 5 * time.Millisecond, CallTimeout: time.Minute, InitialWait: 50 * time.Millisecond,
				Register: register, ClientID: "stalled", Heartbeat: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			// The first topology fetch gave up at InitialWait; then the loop's poll (and
			// the registration) are in flight and will not be answered.
			want := 2
			if register {
				want = 3
			}
			for range want {
				select {
				case <-inflight:
				case <-time.After(20 * time.Second):
					t.Fatal("the membership never called the MDS")
				}
			}
			start := time.Now()
			closed := make(chan struct{})
			go func() { m.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(20 * time.Second):
				t.Fatal("Close waited on the stalled MDS call (CallTimeout is a minute)")
			}
			select {
			case <-m.done:
			default:
				t.Fatal("Close returned before the poll loop did")
			}
			t.Logf("Close took %v", time.Since(start))
		})
	}
}

// View is read concurrently with polls that change it (run with -race): every snapshot is
// whole, and the views move through the epochs the MDS published.
func TestMDSMembershipViewDuringPolls(t *testing.T) {
	srv := newTestMDS(t)
	srv.set(t, "n1", "n2")
	addr, _ := srv.replica(t)
	m := newMembership(t, MDSOptions{Endpoints: []string{addr}, Poll: time.Millisecond, ShrinkPolls: 1})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				v := m.View()
				if len(v.Members) != len(v.Ring.Nodes()) {
					t.Errorf("torn view: %d members, %d ring nodes", len(v.Members), len(v.Ring.Nodes()))
					return
				}
				if len(v.Members) > 0 {
					if _, ok := v.Owner(uint64(reads.Add(1)) * 0x9e3779b97f4a7c15); !ok {
						t.Error("a non-empty view has no owner")
						return
					}
				}
			}
		}()
	}
	sets := [][]string{{"n1", "n2", "n3"}, {"n2", "n3"}, {"n1", "n2", "n3", "n4"}, {"n4"}, {"n1", "n2"}}
	for i, want := range sets {
		srv.set(t, want...)
		deadline := time.Now().Add(10 * time.Second)
		for strings.Join(ids(m.View()), ",") != strings.Join(want, ",") {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: view %v, want %v", i, ids(m.View()), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	if reads.Load() == 0 {
		t.Fatal("no concurrent reads happened")
	}
}

// TestMDSMembershipLongPoll: with the defaults (long polls), a join and a drain reach the
// client's ring well inside a poll period; against an MDS that does not hold long polls
// (its store cannot watch: as an older MDS answers) the client falls back to polling
// every Poll, and still follows the ring.
func TestMDSMembershipLongPoll(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool
		bound time.Duration
	}{{"long poll", true, time.Second}, {"older MDS: polling", false, 3 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			st := mds.NewMemStore()
			var store mds.Store = st
			if !tc.watch {
				store = struct{ mds.Store }{st} // hides the Watcher methods
			}
			svc, err := mds.NewService(mds.Config{Store: store, LeaseTTL: time.Hour, Logger: quietLog()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(svc.Close)
			srv := &testMDS{store: st, svc: svc}
			addr, _ := srv.replica(t)
			srv.set(t, "n1", "n2")
			poll := 2 * time.Second
			m := newMembership(t, MDSOptions{Endpoints: []string{addr}, Poll: poll})
			if len(m.View().Members) != 2 {
				t.Fatalf("initial view %v", ids(m.View()))
			}
			time.Sleep(300 * time.Millisecond) // the loop is now inside its first long poll (or poll wait)
			for _, want := range [][]string{{"n1", "n2", "n3"}, {"n1", "n3"}} {
				srv.set(t, want...)
				t0 := time.Now()
				for strings.Join(ids(m.View()), ",") != strings.Join(want, ",") {
					if time.Since(t0) > tc.bound+poll {
						t.Fatalf("view %v, want %v after %v", ids(m.View()), want, time.Since(t0))
					}
					time.Sleep(5 * time.Millisecond)
				}
				took := time.Since(t0)
				t.Logf("%v reached the client after %v", want, took.Round(time.Millisecond))
				if tc.watch && took > tc.bound {
					t.Fatalf("a pushed change took %v (bound %v)", took, tc.bound)
				}
			}
		})
	}
}
