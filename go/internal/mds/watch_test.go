package mds

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func newWatchService(t *testing.T, healthy func() error) (*Service, *MemStore) {
	t.Helper()
	st := NewMemStore()
	svc, err := NewService(Config{Store: st, LeaseTTL: time.Hour, Healthy: healthy, CallTimeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc, st
}

type pollResult struct {
	resp *wire.MdsResponse
	took time.Duration
}

func longPollAsync(svc *Service, known uint64, wait time.Duration) <-chan pollResult {
	ch := make(chan pollResult, 1)
	go func() {
		t0 := time.Now()
		r := svc.Handle(context.Background(), &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g", WaitMS: uint32(wait / time.Millisecond), KnownTopologyEpoch: known})
		ch <- pollResult{r, time.Since(t0)}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan pollResult, bound time.Duration) pollResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(bound):
		t.Fatalf("long poll still held after %v", bound)
		return pollResult{}
	}
}

// TestLongPollWakesOnChange: a long poll with the current epoch is held until a member
// joins, then answered at once with the new topology; one that ends without a change says
// "unchanged" (no topology) with the honoured wait; a stale epoch is answered at once.
func TestLongPollWakesOnChange(t *testing.T) {
	svc, _ := newWatchService(t, nil)
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n1", "h:1")})
	first := recv(t, longPollAsync(svc, 0, 5*time.Second), time.Second).resp
	if first.Status != fb.StatusOk || first.Topology == nil || len(first.Topology.Members) != 1 || first.WaitMS != 5000 {
		t.Fatalf("long poll without a known epoch: %+v", first)
	}
	known := first.Topology.TopologyEpoch

	unchanged := recv(t, longPollAsync(svc, known, 300*time.Millisecond), 3*time.Second)
	if unchanged.resp.Status != fb.StatusOk || unchanged.resp.Topology != nil || unchanged.resp.WaitMS != 300 || unchanged.took < 250*time.Millisecond {
		t.Fatalf("long poll without a change: %+v after %v", unchanged.resp, unchanged.took)
	}

	held := longPollAsync(svc, known, 20*time.Second)
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-held:
		t.Fatalf("long poll answered before any change: %+v", r.resp)
	default:
	}
	joined := time.Now()
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n2", "h:2")})
	got := recv(t, held, 2*time.Second)
	if got.resp.Topology == nil || len(got.resp.Topology.Members) != 2 || got.resp.Topology.TopologyEpoch == known {
		t.Fatalf("after the join: %+v", got.resp)
	}
	if d := time.Since(joined); d > time.Second {
		t.Fatalf("join reached the long poll after %v", d)
	}
	// The watched copy answers exactly what a direct read does (same epochs on every replica).
	direct, err := svc.Topology(context.Background(), "g")
	if err != nil || direct.MembersEpoch != got.resp.Topology.MembersEpoch || direct.TopologyEpoch != got.resp.Topology.TopologyEpoch {
		t.Fatalf("watched copy %+v differs from the direct read %+v (%v)", got.resp.Topology, direct, err)
	}

	// A drain (deregistration) wakes it just the same.
	held = longPollAsync(svc, got.resp.Topology.TopologyEpoch, 20*time.Second)
	time.Sleep(100 * time.Millisecond)
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpDeregisterMember, Group: "g", Member: &wire.Member{ID: "n1"}})
	if r := recv(t, held, 2*time.Second).resp; r.Topology == nil || len(r.Topology.Members) != 1 || r.Topology.Members[0].ID != "n2" {
		t.Fatalf("after the drain: %+v", r)
	}
}

// TestLongPollEtcdUnhealthy: when the replica's etcd probe fails, held long polls stop
// trusting the watched copy and answer IOError (so the client moves to another replica)
// instead of sitting on a copy that can no longer change.
func TestLongPollEtcdUnhealthy(t *testing.T) {
	var down atomic.Bool
	svc, st := newWatchService(t, func() error {
		if down.Load() {
			return errors.New("etcd down")
		}
		return nil
	})
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n1", "h:1")})
	known := recv(t, longPollAsync(svc, 0, time.Second), time.Second).resp.Topology.TopologyEpoch
	held := longPollAsync(svc, known, 20*time.Second)
	time.Sleep(100 * time.Millisecond)
	st.SetDown(true)
	down.Store(true)
	r := recv(t, held, 3*time.Second).resp
	if r.Status != fb.StatusIOError {
		t.Fatalf("long poll during an etcd outage: %+v", r)
	}
	st.SetDown(false)
	down.Store(false)
	// Back: the copy is rebuilt and long polls are held again, then woken by a change.
	g := svc.watch("g")
	waitUntil(t, 3*time.Second, func() bool {
		_, synced, _ := g.state()
		return synced
	})
	g.done()
	held = longPollAsync(svc, known, 20*time.Second)
	time.Sleep(100 * time.Millisecond)
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n2", "h:2")})
	if r := recv(t, held, 2*time.Second).resp; r.Topology == nil || len(r.Topology.Members) != 2 {
		t.Fatalf("after etcd returned: %+v", r)
	}
}

// TestLongPollClose: Close answers held long polls at once ("unchanged"), and later long
// polls are plain polls (WaitMS 0 tells the client to poll).
func TestLongPollClose(t *testing.T) {
	svc, _ := newWatchService(t, nil)
	call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n1", "h:1")})
	known := recv(t, longPollAsync(svc, 0, time.Second), time.Second).resp.Topology.TopologyEpoch
	held := longPollAsync(svc, known, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	svc.Close()
	if r := recv(t, held, 2*time.Second).resp; r.Status != fb.StatusOk || r.Topology != nil {
		t.Fatalf("held long poll at Close: %+v", r)
	}
	if r := recv(t, longPollAsync(svc, known, 30*time.Second), 2*time.Second).resp; r.WaitMS != 0 || r.Topology == nil {
		t.Fatalf("long poll after Close: %+v", r)
	}
}

func waitUntil(t *testing.T, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
