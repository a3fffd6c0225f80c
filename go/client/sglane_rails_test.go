package client_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// A lane connection whose rail fails mid-batch (an injected completion error on the
// client's soft0): its GET is replayed on a lane connection of soft1, byte-exact, and the
// server saw every GET once (none went over TCP); a lane PUT that fails that way returns
// its error and is not replayed anywhere (the key stays absent), the others land.
func TestSGLaneRailFailureReplay(t *testing.T) {
	const n, piece = 12, 32 << 10
	prov, err := soft.New(soft.Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	eng := store.NewMem(64 << 20)
	rs, _, err := onesided.NewRailServer(onesided.Config{Provider: prov, MaxBlock: 1 << 20, Depth: 8,
		SegmentBytes: 64 << 20, IOTimeout: 10 * time.Second}, eng, []string{"soft0", "soft1"})
	if err != nil {
		t.Fatal(err)
	}
	node := startOn(t, "127.0.0.1:0", eng, server.Config{RDMA: rs})
	t.Cleanup(func() { node.stop(); rs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	open := func(faults string) *client.Client {
		ms, err := client.NewStatic([]client.Member{{ID: "n", Addr: node.addr, Weight: 1}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(client.Options{Membership: ms, BatchConcurrency: 1, IOTimeout: 10 * time.Second,
			RDMA: &client.RDMAOptions{Provider: "soft", Devices: []string{"soft0", "soft1"}, Primary: "soft0",
				Depth: 4, MaxBlock: 1 << 20, SoftFaultFile: faults}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dir := t.TempDir()
	f1, f2 := filepath.Join(dir, "f1"), filepath.Join(dir, "f2")
	for _, f := range []string{f1, f2} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, b := make([]byte, n*piece), make([]byte, n*piece)
	for i := range a {
		a[i], b[i] = byte(i*31+1), byte(i*17+3)
	}

	c := open(f1)
	items := sgItems(n, piece, a, b, "replay")
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil {
			t.Fatalf("put %d: %v", i, it.Err)
		}
	}
	getsBefore := rs.Stats()["dfkv_rdma_v2_get_writes_total"]
	if err := os.WriteFile(f1, []byte("soft0 comp_err 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gets := sgItems(n, piece, make([]byte, n*piece), make([]byte, n*piece), "replay")
	if err := c.BatchGet(ctx, gets, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i := range gets {
		if gets[i].Err != nil || !bytes.Equal(gets[i].Segs[0], items[i].Segs[0]) || !bytes.Equal(gets[i].Segs[1], items[i].Segs[1]) {
			t.Fatalf("get %d: %v or wrong bytes", i, gets[i].Err)
		}
	}
	if got := snap(c, `dfkv_rdma_client_rail_quarantines_total{rail="soft0"}`); got != 1 {
		t.Errorf("soft0 quarantines %v, want 1", got)
	}
	if got := snap(c, `dfkv_rdma_client_rail_replayed_ops_total{rail="soft1"}`); got < 1 {
		t.Errorf("no GET replayed on soft1")
	}
	if got := rs.Stats()["dfkv_rdma_v2_get_writes_total"] - getsBefore; got != 2*n {
		t.Errorf("the server wrote %v GET targets over RDMA, want %d (each GET's two once, none over TCP)", got, 2*n)
	}
	if got := snap(c, "dfkv_rdma_sg_qp_inflight_max"); got != 1 {
		t.Errorf("a QP had %v multi-SGE requests in flight", got)
	}

	// PUTs: a second client, its lane warmed up on soft0, then one injected failure.
	c2 := open(f2)
	if err := c2.BatchPut(ctx, sgItems(4, piece, a, b, "warm")); err != nil {
		t.Fatal(err)
	}
	putsBefore := rs.Stats()["dfkv_rdma_v2_put_writes_total"]
	if err := os.WriteFile(f2, []byte("soft0 comp_err 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	puts := sgItems(8, piece, b, a, "once")
	if err := c2.BatchPut(ctx, puts); err != nil {
		t.Fatal(err)
	}
	var failed []int
	for i, it := range puts {
		if it.Err != nil {
			failed = append(failed, i)
		}
	}
	if len(failed) != 1 {
		t.Fatalf("%d PUTs failed (%v), want exactly the one whose WR failed", len(failed), failed)
	}
	if got := snap(c2, `dfkv_rdma_client_rail_replayed_ops_total{rail="soft1"}`); got > 0 { // -1: no series
		t.Errorf("a PUT was replayed (%v)", got)
	}
	if got := rs.Stats()["dfkv_rdma_v2_put_writes_total"] - putsBefore; got != 7 {
		t.Errorf("the server stored %v of the PUTs over RDMA, want 7", got)
	}
	probe := []client.Item{{Key: puts[failed[0]].Key}}
	if err := c2.BatchExist(ctx, probe); err != nil || !errors.Is(probe[0].Err, client.ErrNotFound) {
		t.Errorf("the failed PUT's key: %v (want not found: never replayed, over TCP either)", probe[0].Err)
	}
}
