package onesided

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// startRailServer runs a RailServer on a loopback TCP listener.
func startRailServer(t *testing.T, r *RailServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r.Serve(context.Background(), c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		r.Close()
	})
	return ln.Addr().String()
}

func TestRailServerServesTheOfferedRail(t *testing.T) {
	// The server's fault file takes its soft2 down before start: that rail cannot serve.
	faults := filepath.Join(t.TempDir(), "faults")
	if err := soft.WriteFaults(faults, "soft2 port down\n"); err != nil {
		t.Fatal(err)
	}
	sp, err := soft.New(soft.Options{Devices: 3, FaultFile: faults})
	if err != nil {
		t.Fatal(err)
	}
	const segBytes = 64 << 20
	r, skipped, err := NewRailServer(Config{Provider: sp, MaxBlock: 1 << 20, Depth: 4, SegmentBytes: segBytes},
		store.NewMem(64<<20), []string{"soft0", "soft1", "soft2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Devices(); len(got) != 2 || got[0] != "soft0" || got[1] != "soft1" || skipped["soft2"] == nil || r.Device() != "soft0" {
		t.Fatalf("served %v, skipped %v", got, skipped)
	}
	var soft1Healthy atomic.Bool
	soft1Healthy.Store(true)
	r.SetHealth(func(d string) bool { return d != "soft1" || soft1Healthy.Load() })
	addr := startRailServer(t, r)
	cp := softProvider(t, soft.Options{Devices: 3}) // the client's own NICs, same names

	roundTrip := func(dev string, seed int) {
		t.Helper()
		boot, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer boot.Close()
		c, err := Dial(boot, Config{Provider: cp, Device: dev, MaxBlock: 1 << 20, Depth: 2, IOTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		v := randBytes(200000+seed, uint64(seed))
		put := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(seed), Value: [][]byte{v}}
		get := &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(seed), Dst: [][]byte{make([]byte, len(v))}}
		if err := c.Do(context.Background(), []*Op{put, get}); err != nil || put.Status != fb.StatusOk || get.Status != fb.StatusOk || !bytes.Equal(get.Dst[0], v) {
			t.Fatalf("via %s: %v %s %s", dev, err, put.Status, get.Status)
		}
	}
	conns := func() (a, b float64) {
		rs := r.RailStats()
		return rs["soft0"]["dfkv_rdma_v2_conns_opened_total"], rs["soft1"]["dfkv_rdma_v2_conns_opened_total"]
	}
	roundTrip("soft1", 1) // served on soft1
	if a, b := conns(); a != 0 || b != 1 {
		t.Fatalf("offer naming soft1: soft0 %v soft1 %v", a, b)
	}
	roundTrip("soft0", 2)
	if a, b := conns(); a != 1 || b != 1 {
		t.Fatalf("offer naming soft0: soft0 %v soft1 %v", a, b)
	}
	roundTrip("soft2", 3) // not served here (down at start): the preferred healthy rail
	if a, b := conns(); a != 2 || b != 1 {
		t.Fatalf("offer naming soft2: soft0 %v soft1 %v", a, b)
	}
	soft1Healthy.Store(false)
	roundTrip("soft1", 4) // unhealthy here: moved to soft0
	if a, b := conns(); a != 3 || b != 1 {
		t.Fatalf("offer naming an unhealthy soft1: soft0 %v soft1 %v", a, b)
	}
	// soft2's port comes up: added, it serves the offers naming it.
	if err := r.AddRail("soft2"); err == nil {
		t.Fatal("soft2 added while its port is down")
	}
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.AddRail("soft2"); err != nil {
		t.Fatal(err)
	}
	if err := r.AddRail("soft2"); err != nil { // already served: no-op
		t.Fatal(err)
	}
	if err := r.AddRail("mlx5_0"); err == nil {
		t.Fatal("an unconfigured rail added")
	}
	if got := r.Devices(); len(got) != 3 || got[2] != "soft2" {
		t.Fatalf("served after AddRail: %v", got)
	}
	roundTrip("soft2", 5)
	if n := r.RailStats()["soft2"]["dfkv_rdma_v2_conns_opened_total"]; n != 1 {
		t.Fatalf("offer naming the added soft2: served there %v times", n)
	}
	st := r.Stats()
	if st["dfkv_rdma_v2_conns_opened_total"] != 5 || st["dfkv_rdma_recv_segment_bytes"] != segBytes {
		t.Fatalf("summed stats %v", st)
	}
	// Every connection closed: the shared segment is whole again (its lease went back from
	// whichever rail served it).
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats()["dfkv_rdma_recv_segment_free_bytes"] != segBytes {
		if time.Now().After(deadline) {
			t.Fatalf("segment free %v of %v", r.Stats()["dfkv_rdma_recv_segment_free_bytes"], segBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRailServerNoRail(t *testing.T) {
	sp := softProvider(t, soft.Options{Devices: 1})
	if _, _, err := NewRailServer(Config{Provider: sp, SegmentBytes: 1 << 20}, store.NewMem(1<<20), []string{"mlx5_0"}); err == nil {
		t.Fatal("a rail server with no servable rail")
	}
	if _, _, err := NewRailServer(Config{Provider: sp}, store.NewMem(1<<20), nil); err == nil {
		t.Fatal("a rail server with no rails")
	}
}
