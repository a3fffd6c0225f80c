package mdsclient_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/mds"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func TestParse(t *testing.T) {
	eps := []struct {
		in   string
		n    int
		fail bool
	}{
		{"127.0.0.1:1", 1, false},
		{" a:1 , b:2 ,", 2, false},
		{"", 0, true},
		{"nohost", 0, true},
	}
	for _, tt := range eps {
		got, err := mdsclient.ParseEndpoints(tt.in)
		if (err != nil) != tt.fail || len(got) != tt.n {
			t.Errorf("ParseEndpoints(%q) = %v, %v", tt.in, got, err)
		}
	}
	infos := []struct {
		in   string
		n    int
		fail bool
	}{
		{"", 0, false},
		{"engine=vllm,role=decode", 2, false},
		{"a=", 1, false},
		{"novalue", 0, true},
		{"=x", 0, true},
	}
	for _, tt := range infos {
		got, err := mdsclient.ParseInfo(tt.in)
		if (err != nil) != tt.fail || len(got) != tt.n {
			t.Errorf("ParseInfo(%q) = %v, %v", tt.in, got, err)
		}
	}
	if _, err := mdsclient.New(nil, mdsclient.Options{}); !errors.Is(err, mdsclient.ErrNoEndpoints) {
		t.Fatal(err)
	}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestHolderReRegistersAndDeregisters(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := &clock{t: time.Unix(100, 0)}
	st := mds.NewMemStore()
	st.Now = clk.now
	svc, err := mds.NewService(mds.Config{Store: st, LeaseTTL: 3 * time.Second, Logger: log, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mds.NewServer(mds.ServerConfig{Service: svc, Logger: log})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	rpc, _ := mdsclient.New([]string{ln.Addr().String()}, mdsclient.Options{CallTimeout: time.Second})
	member := &wire.Member{ID: "n1", Addr: "127.0.0.1:7", Weight: 1, Eligible: true}
	h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc, Group: "g", Member: member, Heartbeat: 20 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.Start()
	select {
	case <-h.FirstRegistered():
	case <-time.After(5 * time.Second):
		t.Fatal("never registered")
	}
	members := func() int {
		topo, err := svc.Topology(context.Background(), "g")
		if err != nil {
			t.Fatal(err)
		}
		return len(topo.Members)
	}
	// Expire the lease behind the holder's back: its next heartbeat gets NotFound and it
	// registers again.
	clk.add(time.Hour)
	if members() != 0 {
		t.Fatal("lease did not expire")
	}
	deadline := time.Now().Add(5 * time.Second)
	for members() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("holder did not re-register")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if members() != 0 || h.Registered() {
		t.Fatal("Stop did not deregister")
	}
	if _, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc}); !errors.Is(err, mdsclient.ErrBadHolder) {
		t.Fatal(err)
	}
}

func TestHolderUpdateMember(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := mds.NewService(mds.Config{Store: mds.NewMemStore(), LeaseTTL: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mds.NewServer(mds.ServerConfig{Service: svc, Logger: log})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	rpc, _ := mdsclient.New([]string{ln.Addr().String()}, mdsclient.Options{CallTimeout: time.Second})
	member := &wire.Member{ID: "n1", Addr: "127.0.0.1:7", Weight: 1, Eligible: true,
		Rails: []wire.Rail{{Device: "soft0", PortState: 4, QueryOK: true, Health: fb.RailHealthHealthy, Generation: 1}}}
	// A heartbeat far away: only UpdateMember's immediate send can carry the change.
	h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc, Group: "g", Member: member, Heartbeat: time.Hour, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.Start()
	defer h.Stop(context.Background())
	select {
	case <-h.FirstRegistered():
	case <-time.After(5 * time.Second):
		t.Fatal("never registered")
	}
	topo := func() *wire.Topology {
		tp, err := svc.Topology(context.Background(), "g")
		if err != nil || len(tp.Members) != 1 {
			t.Fatalf("%+v %v", tp, err)
		}
		return tp
	}
	before := topo()
	down := *member
	down.Rails = []wire.Rail{{Device: "soft0", PortState: 1, QueryOK: true, Health: fb.RailHealthDown, Generation: 2}}
	if err := h.UpdateMember(&down); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for topo().Members[0].Rails[0].Health != fb.RailHealthDown {
		if time.Now().After(deadline) {
			t.Fatal("the updated record never reached the MDS")
		}
		time.Sleep(5 * time.Millisecond)
	}
	after := topo()
	if after.MembersEpoch != before.MembersEpoch || after.TopologyEpoch == before.TopologyEpoch {
		t.Fatalf("epochs before %x/%x after %x/%x", before.MembersEpoch, before.TopologyEpoch, after.MembersEpoch, after.TopologyEpoch)
	}
	other := down
	other.ID = "n2"
	if err := h.UpdateMember(&other); err == nil {
		t.Fatal("a different member id accepted")
	}
}

// silentReplica accepts connections and reads what arrives but never answers: a hung MDS
// (SIGSTOP), whose kernel still completes connects and takes requests.
func silentReplica(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			go io.Copy(io.Discard, nc)
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
	return ln.Addr().String()
}

// TestLongPollAfterHungReplica: a long poll whose first replica hangs used up most of the
// caller's budget; the next replica is asked to hold only what is left, so the call ends
// with its "unchanged" answer instead of being cut off mid-wait (an error, a dropped
// connection and a plain-poll pause in the membership loop).
func TestLongPollAfterHungReplica(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := mds.NewService(mds.Config{Store: mds.NewMemStore(), LeaseTTL: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mds.NewServer(mds.ServerConfig{Service: svc, Logger: log})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	good := ln.Addr().String()
	const callTimeout, wait = 500 * time.Millisecond, 2 * time.Second
	direct, _ := mdsclient.New([]string{good}, mdsclient.Options{CallTimeout: time.Second})
	first, _, err := direct.Call(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g"})
	if err != nil || first.Topology == nil {
		t.Fatalf("plain topology read: %v", err)
	}
	c, _ := mdsclient.New([]string{silentReplica(t), good}, mdsclient.Options{CallTimeout: callTimeout})
	// The membership loop's budget: the wait plus a call timeout per replica and one more.
	ctx, cancel := context.WithTimeout(context.Background(), wait+3*callTimeout)
	defer cancel()
	resp, ep, err := c.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g", WaitMS: uint32(wait / time.Millisecond),
		KnownTopologyEpoch: first.Topology.TopologyEpoch})
	if err != nil {
		t.Fatalf("long poll after a hung replica: %v (the next replica's wait was not fitted to the budget)", err)
	}
	if ep != good {
		t.Fatalf("answered by %s, want %s", ep, good)
	}
	if resp.WaitMS >= uint32(wait/time.Millisecond) {
		t.Fatalf("the next replica was asked to hold %d ms, the whole wait: nothing was left of the budget for it", resp.WaitMS)
	}
	t.Logf("the next replica held %d ms of the %v wait", resp.WaitMS, wait)
}

// stallPut applies every Put, then holds its reply until release closes: the MDS has the
// registration while the holder is still waiting for the answer.
type stallPut struct {
	mds.Store
	applied chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *stallPut) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	err := s.Store.Put(ctx, key, value, ttl)
	s.once.Do(func() { close(s.applied) })
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return err
}

// Stop during a registration the MDS already applied (its reply not yet back) still
// deregisters: the holder cannot tell whether it landed, so it must not assume it did not.
func TestHolderStopDuringRegistrationDeregisters(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := &stallPut{Store: mds.NewMemStore(), applied: make(chan struct{}), release: make(chan struct{})}
	svc, err := mds.NewService(mds.Config{Store: st, LeaseTTL: time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mds.NewServer(mds.ServerConfig{Service: svc, Logger: log})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	defer close(st.release) // before the shutdown, which waits for the stalled reply

	rpc, _ := mdsclient.New([]string{ln.Addr().String()}, mdsclient.Options{CallTimeout: 10 * time.Second})
	member := &wire.Member{ID: "n1", Addr: "127.0.0.1:7", Weight: 1, Eligible: true}
	h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc, Group: "g", Member: member, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.Start()
	select {
	case <-st.applied:
	case <-time.After(5 * time.Second):
		t.Fatal("the registration never reached the store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	topo, err := svc.Topology(context.Background(), "g")
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Members) != 0 {
		t.Fatalf("%d members after Stop interrupted an applied registration, want 0", len(topo.Members))
	}
}
