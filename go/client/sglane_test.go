package client_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// putGate is an engine that records how many PUTs are inside it at once. Armed with want,
// the first PUTs wait (bounded) until want of them are inside together: a batch that does
// not really run want connections wide then shows a lower width instead of passing by luck
// of the scheduler.
type putGate struct {
	store.Engine
	want    int64
	in, max atomic.Int64
	puts    atomic.Int64
	once    sync.Once
	reached chan struct{}
}

func (g *putGate) Put(key store.Key, size int, fill func([]byte) error) error {
	n := g.in.Add(1)
	defer g.in.Add(-1)
	g.puts.Add(1)
	for {
		cur := g.max.Load()
		if n <= cur || g.max.CompareAndSwap(cur, n) {
			break
		}
	}
	if g.want > 0 {
		if n >= g.want {
			g.once.Do(func() { close(g.reached) })
		}
		select {
		case <-g.reached:
		case <-time.After(3 * time.Second): // never reached: the width is below want
		}
	}
	return g.Engine.Put(key, size, fill)
}

func snap(c *client.Client, name string) float64 {
	for _, l := range strings.Split(string(c.Snapshot()), "\n") {
		if strings.HasPrefix(l, name+" ") {
			v, _ := strconv.ParseFloat(l[len(name)+1:], 64)
			return v
		}
	}
	return -1
}

// sgServer starts an in-process dfkv server whose RdmaBootstrap is served by a real
// onesided server over the soft NIC (the test process is both hosts).
func sgServer(t testing.TB, gate *putGate) (*testNode, *onesided.Server) {
	t.Helper()
	prov, err := soft.New(soft.Options{Devices: 1})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := onesided.NewServer(onesided.Config{Provider: prov, Device: "soft0", MaxBlock: 1 << 20, Depth: 8,
		SegmentBytes: 128 << 20, IOTimeout: 10 * time.Second}, gate)
	if err != nil {
		t.Fatal(err)
	}
	n := startOn(t, "127.0.0.1:0", gate, server.Config{RDMA: rs})
	t.Cleanup(func() { n.stop(); rs.Close() })
	return n, rs
}

func sgClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n", Addr: addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	// One chunk per batch: any width beyond one connection is the SG lane's doing.
	c, err := client.New(client.Options{Membership: ms, BatchConcurrency: 1, IOTimeout: 10 * time.Second,
		RDMA: &client.RDMAOptions{Provider: "soft", Depth: 4, MaxBlock: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sgItems makes n items whose values are gathered from two pieces each, the even items'
// from registered range a, the odd items' from registered range b.
func sgItems(n, piece int, a, b []byte, tag string) []client.Item {
	items := make([]client.Item, n)
	for i := range items {
		r := a
		if i%2 == 1 {
			r = b
		}
		off := (i / 2) * 2 * piece
		items[i] = client.Item{Key: []byte(fmt.Sprintf("%s/%d", tag, i)), Segs: [][]byte{r[off : off+piece], r[off+piece : off+2*piece]}}
	}
	return items
}

// Two registered ranges written (and read back) concurrently by one batch at depth 4: no QP
// ever has two multi-SGE requests in flight, and the batch still runs 4 QPs wide (the
// server holds 4 PUTs at once). With the lane switched off the same per-QP series catch
// the overlap and the width collapses to one connection, so this test fails without the
// lane.
func TestSGLaneDepthOnePerQPBatchWide(t *testing.T) {
	const n, piece = 16, 64 << 10
	gate := &putGate{Engine: store.NewMem(256 << 20), want: 4, reached: make(chan struct{})}
	node, rs := sgServer(t, gate)
	c := sgClient(t, node.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	rnd := rand.New(rand.NewPCG(1, 2))
	a, b := make([]byte, n*piece), make([]byte, n*piece)
	for i := range a {
		a[i], b[i] = byte(rnd.Uint32()), byte(rnd.Uint32())
	}
	ra, rb := make([]byte, len(a)), make([]byte, len(b))
	for _, m := range [][]byte{a, b, ra, rb} {
		if err := c.RegisterMemory(m); err != nil {
			t.Fatal(err)
		}
	}
	items := sgItems(n, piece, a, b, "sg")
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil {
			t.Fatalf("put %d: %v", i, it.Err)
		}
	}
	gets := sgItems(n, piece, ra, rb, "sg")
	if err := c.BatchGet(ctx, gets, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i := range gets {
		if gets[i].Err != nil || gets[i].N != 2*piece {
			t.Fatalf("get %d: n=%d %v", i, gets[i].N, gets[i].Err)
		}
	}
	if crc32.ChecksumIEEE(ra) != crc32.ChecksumIEEE(a) || !bytes.Equal(ra, a) || !bytes.Equal(rb, b) {
		t.Fatal("read back bytes differ from the written ranges")
	}

	if got := snap(c, "dfkv_rdma_sg_ops_total"); got != 2*n {
		t.Errorf("multi-SGE requests %v, want %d (every item over RDMA)", got, 2*n)
	}
	if got := snap(c, "dfkv_rdma_sg_qp_inflight_max"); got != 1 {
		t.Errorf("a QP had %v multi-SGE requests in flight at once, want 1", got)
	}
	if got := snap(c, "dfkv_rdma_sg_qp_overlaps_total"); got != 0 {
		t.Errorf("%v multi-SGE requests overlapped another on their QP", got)
	}
	if got := gate.max.Load(); got != 4 {
		t.Errorf("the server held %d of the batch's PUTs at once, want 4 (depth)", got)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_busy_max"); got != 4 {
		t.Errorf("SG lane width %v, want 4", got)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_conns_opened_total"); got != 4 {
		t.Errorf("SG lane connections opened %v, want 4 (reused by the GETs)", got)
	}
	if got := snap(c, "dfkv_rdma_mr_pool_ops_total"); got != 2*n {
		t.Errorf("pool-MR ops %v, want %d (both ranges registered)", got, 2*n)
	}
	if gate.puts.Load() != n || rs.M.V2PutWrites.Load() != n {
		t.Errorf("server stored %d PUTs, %d of them over RDMA v2; want %d", gate.puts.Load(), rs.M.V2PutWrites.Load(), n)
	}
	if got := snap(c, "dfkv_rdma_v2_conns_opened_total"); got != 4 {
		t.Errorf("RDMA connections %v, want 4: the SG items used no scalar connection", got)
	}

	// Single-piece items in the same batch use the scalar pool alongside the lane.
	mixed := append(sgItems(4, piece, a, b, "mixed"),
		client.Item{Key: []byte("scalar/0"), Value: a[:piece]}, client.Item{Key: []byte("scalar/1"), Value: b[:piece]})
	if err := c.BatchPut(ctx, mixed); err != nil {
		t.Fatal(err)
	}
	for i, it := range mixed {
		if it.Err != nil {
			t.Fatalf("mixed put %d: %v", i, it.Err)
		}
	}
	if got := snap(c, "dfkv_rdma_v2_conns_opened_total"); got != 5 {
		t.Errorf("RDMA connections %v, want 5 (4 lane + 1 scalar)", got)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_conns"); got != 4 {
		t.Errorf("SG lane connections open %v, want 4", got)
	}
	if got := snap(c, "dfkv_rdma_sg_qp_inflight_max"); got != 1 {
		t.Errorf("a QP had %v multi-SGE requests in flight at once, want 1", got)
	}

	t.Run("lane off", func(t *testing.T) {
		defer client.SetSGLaneOff(true)()
		gate2 := &putGate{Engine: store.NewMem(256 << 20)}
		node2, _ := sgServer(t, gate2)
		c2 := sgClient(t, node2.addr)
		for _, m := range [][]byte{a, b} {
			if err := c2.RegisterMemory(m); err != nil {
				t.Fatal(err)
			}
		}
		items := sgItems(n, piece, a, b, "off")
		if err := c2.BatchPut(ctx, items); err != nil {
			t.Fatal(err)
		}
		for i, it := range items {
			if it.Err != nil {
				t.Fatalf("put %d: %v", i, it.Err)
			}
		}
		if got := snap(c2, "dfkv_rdma_sg_qp_inflight_max"); got < 2 {
			t.Errorf("without the lane a QP had at most %v multi-SGE requests in flight; the series should catch the overlap", got)
		}
		if got := snap(c2, "dfkv_rdma_sg_qp_overlaps_total"); got < 1 {
			t.Errorf("without the lane no overlap was counted")
		}
		if got := gate2.max.Load(); got != 1 {
			t.Errorf("without the lane the server held %d PUTs at once, want 1 (one connection)", got)
		}
	})
}

// The lane is bounded per server (SGLaneConns): a depth-4 batch against a lane of 2 runs 2
// wide (its two connections take turns through the items), counts the lane full, never
// puts two multi-SGE requests on one QP; idle lane connections are reclaimed like the
// scalar pool's (the server's connections drop to 0) and the next batch opens fresh ones.
func TestSGLaneBoundAndIdleReclaim(t *testing.T) {
	const n, piece = 8, 32 << 10
	// The first PUTs wait until 2 are inside: the lane's width shows as 2 only if it really
	// runs its two connections at once, whatever the scheduler does.
	gate := &putGate{Engine: store.NewMem(64 << 20), want: 2, reached: make(chan struct{})}
	node, rs := sgServer(t, gate)
	ms, err := client.NewStatic([]client.Member{{ID: "n", Addr: node.addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	idle := 300 * time.Millisecond
	c, err := client.New(client.Options{Membership: ms, BatchConcurrency: 1, IOTimeout: 10 * time.Second,
		RDMA: &client.RDMAOptions{Provider: "soft", Depth: 4, MaxBlock: 1 << 20, SGLaneConns: 2, IdleTimeout: idle}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, b := make([]byte, n*piece), make([]byte, n*piece)
	for i := range a {
		a[i], b[i] = byte(i*7), byte(i*13)
	}
	items := sgItems(n, piece, a, b, "bound")
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil {
			t.Fatalf("put %d: %v", i, it.Err)
		}
	}
	if got := snap(c, "dfkv_rdma_sg_lane_conns_opened_total"); got != 2 {
		t.Errorf("lane connections opened %v, want 2 (the bound)", got)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_busy_max"); got != 2 {
		t.Errorf("lane width %v, want 2", got)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_full_total"); got < 1 {
		t.Errorf("lane full not counted")
	}
	if got := snap(c, "dfkv_rdma_sg_qp_inflight_max"); got != 1 {
		t.Errorf("a QP had %v multi-SGE requests in flight", got)
	}
	if got := gate.puts.Load(); got != n || rs.M.V2PutWrites.Load() != n {
		t.Errorf("server stored %d PUTs, %d over RDMA; want %d", got, rs.M.V2PutWrites.Load(), n)
	}
	gets := sgItems(n, piece, make([]byte, n*piece), make([]byte, n*piece), "bound")
	if err := c.BatchGet(ctx, gets, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i := range gets {
		want := items[i].Segs
		if gets[i].Err != nil || !bytes.Equal(gets[i].Segs[0], want[0]) || !bytes.Equal(gets[i].Segs[1], want[1]) {
			t.Fatalf("get %d: %v or wrong bytes", i, gets[i].Err)
		}
	}

	deadline := time.Now().Add(10 * time.Second)
	for snap(c, "dfkv_rdma_sg_lane_conns") != 0 || rs.M.ActiveConns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("idle lane connections not reclaimed: lane %v, server active %d",
				snap(c, "dfkv_rdma_sg_lane_conns"), rs.M.ActiveConns.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := snap(c, "dfkv_rdma_idle_reclaims_total"); got < 2 {
		t.Errorf("idle reclaims %v, want at least the 2 lane connections", got)
	}
	if err := c.BatchPut(ctx, sgItems(2, piece, a, b, "again")); err != nil {
		t.Fatal(err)
	}
	if got := snap(c, "dfkv_rdma_sg_lane_conns_opened_total"); got != 4 {
		t.Errorf("lane connections opened %v after the reclaim, want 4 (2 fresh)", got)
	}
}
