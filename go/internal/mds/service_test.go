package mds

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestService(t *testing.T) (*Service, *MemStore, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	st := NewMemStore()
	st.Now = clk.now
	svc, err := NewService(Config{Store: st, LeaseTTL: 3 * time.Second, ClientLeaseTTL: 3 * time.Second, Logger: quiet(), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return svc, st, clk
}

func member(id, addr string) *wire.Member {
	return &wire.Member{ID: id, Addr: addr, Weight: 1, Eligible: true, Version: "v1", Config: []wire.KV{{Key: "engine", Value: "slab"}}}
}

func call(t *testing.T, svc *Service, r wire.MdsRequest) *wire.MdsResponse {
	t.Helper()
	return svc.Handle(context.Background(), &r)
}

func TestMembersLifecycle(t *testing.T) {
	svc, _, clk := newTestService(t)
	for _, id := range []string{"n2", "n1", "n3"} {
		if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member(id, "127.0.0.1:1"+id[1:])}); r.Status != fb.StatusOk || r.LeaseTTLMS != 3000 {
			t.Fatalf("register %s: %+v", id, r)
		}
	}
	list := func() *wire.Topology {
		r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g"})
		if r.Status != fb.StatusOk || r.Topology == nil {
			t.Fatalf("list: %+v", r)
		}
		return r.Topology
	}
	topo := list()
	if len(topo.Members) != 3 || topo.Members[0].ID != "n1" || topo.Members[2].ID != "n3" {
		t.Fatalf("members %+v", topo.Members)
	}
	// Other groups are disjoint.
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "other"}); len(r.Topology.Members) != 0 {
		t.Fatalf("group leak: %+v", r.Topology)
	}
	// n1 and n2 heartbeat; n3 stops. After the TTL only n3 is gone.
	for i := 0; i < 3; i++ {
		clk.add(time.Second)
		for _, id := range []string{"n1", "n2"} {
			if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpHeartbeatMember, Group: "g", Member: member(id, "127.0.0.1:1"+id[1:])}); r.Status != fb.StatusOk {
				t.Fatalf("heartbeat %s: %+v", id, r)
			}
		}
	}
	topo2 := list()
	if len(topo2.Members) != 2 || topo2.MembersEpoch == topo.MembersEpoch {
		t.Fatalf("after expiry: %+v", topo2)
	}
	// A heartbeat for the expired member says NotFound: the holder registers again.
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpHeartbeatMember, Group: "g", Member: member("n3", "127.0.0.1:13")}); r.Status != fb.StatusNotFound {
		t.Fatalf("heartbeat of expired member: %+v", r)
	}
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n3", "127.0.0.1:13")})
	if got := list(); got.MembersEpoch != topo.MembersEpoch || got.TopologyEpoch != topo.TopologyEpoch {
		t.Fatal("same content must give the same epochs")
	}
	// A version change moves only the topology epoch.
	m := member("n3", "127.0.0.1:13")
	m.Version = "v2"
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpHeartbeatMember, Group: "g", Member: m})
	if got := list(); got.MembersEpoch != topo.MembersEpoch || got.TopologyEpoch == topo.TopologyEpoch {
		t.Fatalf("version change: epochs %x/%x vs %x/%x", got.MembersEpoch, got.TopologyEpoch, topo.MembersEpoch, topo.TopologyEpoch)
	}
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpDeregisterMember, Group: "g", Member: &wire.Member{ID: "n3"}})
	if got := list(); len(got.Members) != 2 {
		t.Fatalf("deregister: %+v", got.Members)
	}
}

func TestClientsNeverInRing(t *testing.T) {
	svc, _, clk := newTestService(t)
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n1", "h:1")})
	c := &wire.ClientInfo{ID: "vllm-1", Info: []wire.KV{{Key: "engine", Value: "vllm"}}, PID: 7, Hostname: "gpu1"}
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterClient, Group: "g", Client: c}); r.Status != fb.StatusOk {
		t.Fatalf("register client: %+v", r)
	}
	r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListClients, Group: "g"})
	if len(r.Clients) != 1 || r.Clients[0].ID != "vllm-1" || r.Clients[0].RegisteredUnixMS != 1000_000 || r.Clients[0].Info[0].Value != "vllm" {
		t.Fatalf("clients: %+v", r.Clients)
	}
	if topo := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g"}).Topology; len(topo.Members) != 1 {
		t.Fatalf("client entered the ring: %+v", topo.Members)
	}
	clk.add(2 * time.Second)
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpHeartbeatClient, Group: "g", Client: &wire.ClientInfo{ID: "vllm-1"}}); r.Status != fb.StatusOk {
		t.Fatalf("heartbeat client: %+v", r)
	}
	clk.add(2 * time.Second)
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListClients, Group: "g"}); len(r.Clients) != 1 || r.Clients[0].PID != 7 {
		t.Fatalf("heartbeat must keep the client and its info: %+v", r.Clients)
	}
	clk.add(4 * time.Second)
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListClients, Group: "g"}); len(r.Clients) != 0 || r.Clients == nil {
		t.Fatalf("expired client still listed (or nil list): %+v", r)
	}
}

func TestInvalidRequests(t *testing.T) {
	svc, _, _ := newTestService(t)
	bad := func(m *wire.Member) *wire.Member { return m }
	tests := []struct {
		name string
		req  wire.MdsRequest
	}{
		{"no member", wire.MdsRequest{Op: fb.MdsOpRegisterMember}},
		{"empty id", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: bad(&wire.Member{Addr: "h:1", Weight: 1})}},
		{"slash in id", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: bad(&wire.Member{ID: "a/b", Addr: "h:1", Weight: 1})}},
		{"bad address", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: bad(&wire.Member{ID: "a", Addr: "nope", Weight: 1})}},
		{"port zero", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: bad(&wire.Member{ID: "a", Addr: "h:0", Weight: 1})}},
		{"weight zero", wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: bad(&wire.Member{ID: "a", Addr: "h:1"})}},
		{"bad group", wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "a/b"}},
		{"no client", wire.MdsRequest{Op: fb.MdsOpRegisterClient}},
		{"client id with space", wire.MdsRequest{Op: fb.MdsOpRegisterClient, Client: &wire.ClientInfo{ID: "a b"}}},
		{"unknown op", wire.MdsRequest{Op: 99}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := call(t, svc, tt.req); r.Status != fb.StatusInvalid || r.Error == "" {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

func TestBackendDown(t *testing.T) {
	svc, st, _ := newTestService(t)
	st.SetDown(true)
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g"}); r.Status != fb.StatusIOError {
		t.Fatalf("list with etcd down: %+v", r)
	}
	p := NewProber(st, time.Hour, time.Second, 2, nil)
	p.probe()
	if p.Ready() == nil {
		t.Fatal("ready before any successful probe")
	}
	st.SetDown(false)
	p.probe()
	if p.Ready() != nil {
		t.Fatal("not ready after a good probe")
	}
	st.SetDown(true)
	p.probe()
	if p.Ready() != nil {
		t.Fatal("one failed probe must not flip readiness (debounce)")
	}
	p.probe()
	if err := p.Ready(); err == nil || !errors.Is(err, ErrBackend) {
		t.Fatalf("two failed probes: %v", err)
	}
}

func TestEpochs(t *testing.T) {
	a := []wire.Member{*member("a", "h:1"), *member("b", "h:2")}
	b := []wire.Member{*member("b", "h:2"), *member("a", "h:1")}
	ma, ta := Epochs(a)
	mb, tb := Epochs(b)
	if ma != mb || ta != tb || ma == 0 {
		t.Fatal("epochs depend on order")
	}
	tests := []struct {
		name        string
		mut         func(m *wire.Member)
		placement   bool
		topologyToo bool
	}{
		{"address", func(m *wire.Member) { m.Addr = "h:9" }, true, true},
		{"weight", func(m *wire.Member) { m.Weight = 2 }, true, true},
		{"eligible", func(m *wire.Member) { m.Eligible = false }, true, true},
		{"version", func(m *wire.Member) { m.Version = "x" }, false, true},
		{"config", func(m *wire.Member) { m.Config = nil }, false, true},
		{"rail", func(m *wire.Member) { m.Rails = []wire.Rail{{Device: "mlx5_0", PortState: 4}} }, false, true},
		{"rail port state", func(m *wire.Member) { m.Rails[1].PortState = 1 }, false, true},
		{"rail query", func(m *wire.Member) { m.Rails[1].QueryOK = false }, false, true},
		{"rail health", func(m *wire.Member) { m.Rails[1].Health = fb.RailHealthQuarantined }, false, true},
		{"rail generation", func(m *wire.Member) { m.Rails[1].Generation++ }, false, true},
		{"rail tier", func(m *wire.Member) { m.Rails[1].Tier = 1 }, false, true},
		{"rail numa", func(m *wire.Member) { m.Rails[1].NUMANode = 1 }, false, true},
		{"rail port", func(m *wire.Member) { m.Rails[1].Port = 2 }, false, true},
		{"rail order", func(m *wire.Member) { m.Rails[0], m.Rails[1] = m.Rails[1], m.Rails[0] }, false, false},
	}
	railed := func(m *wire.Member) *wire.Member {
		m.Rails = []wire.Rail{
			{Device: "soft0", PortState: 4, PhysState: 5, QueryOK: true, Port: 1, NUMANode: -1, Health: fb.RailHealthHealthy, Generation: 1},
			{Device: "soft1", PortState: 4, PhysState: 5, QueryOK: true, Port: 1, NUMANode: -1, Health: fb.RailHealthHealthy, Generation: 1},
		}
		return m
	}
	ma, ta = Epochs([]wire.Member{*member("a", "h:1"), *railed(member("b", "h:2"))})
	for _, tt := range tests {
		c := []wire.Member{*member("a", "h:1"), *railed(member("b", "h:2"))}
		tt.mut(&c[1])
		mc, tc := Epochs(c)
		if (mc != ma) != tt.placement || (tc != ta) != tt.topologyToo {
			t.Errorf("%s: members epoch changed=%v topology changed=%v", tt.name, mc != ma, tc != ta)
		}
	}
}
