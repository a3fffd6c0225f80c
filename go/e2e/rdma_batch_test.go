package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// requests sums the server's dfkv_server_requests_total for one op (every status).
func (s *serverProc) requests(op fb.Op) float64 {
	s.t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	prefix := `dfkv_server_requests_total{op="` + fb.EnumNamesOp[op] + `"`
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix) {
			v, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			total += v
		}
	}
	return total
}

// Batch, scatter-gather and range calls of the Go client over RDMA v2 against the real
// dfkv_server (soft provider): 1 B – 64 MiB byte-exact, windows of requests on one
// connection with replies in order, no batch frame over TCP, v2 and MR counters moving.
func TestRDMABatchSGRange(t *testing.T) { rdmaSuite(t, rdmaProvider, rdmaDev) }

// rdmaSuite is the cross-process suite over one provider (and device, "" = the first with
// an ACTIVE port).
func rdmaSuite(t *testing.T, provider, dev string) {
	ctx := t.Context()
	args := []string{"--rdma", "--rdma-provider", provider, "--cap", "1GiB", "--max-msg", "64MiB",
		"--rdma-segment", "448MiB", "--rdma-depth", "4"}
	if dev != "" {
		args = append(args, "--rdma-dev", dev)
	}
	s := startServer(t, t.TempDir(), args...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("rdma-batch"), IOTimeout: fabricTimeout(60 * time.Second),
		BatchConcurrency: 2, RDMA: &client.RDMAOptions{Provider: provider, Device: dev, MaxBlock: 64 << 20, Depth: 2, MaxConns: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sizes := []int{1, 4095, 64<<10 + 1, 1 << 20, 4<<20 + 7, 64 << 20}
	vals := make([][]byte, len(sizes))
	items := make([]client.Item, len(sizes))
	for i, n := range sizes {
		vals[i] = rnd(n, uint64(200+i))
		items[i] = client.Item{Key: []byte("b" + strconv.Itoa(i)), Value: vals[i]}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil || it.N != int64(sizes[i]) {
			t.Fatalf("batch put item %d (%d bytes): %v n=%d", i, sizes[i], it.Err, it.N)
		}
	}
	if got := s.metric("dfkv_rdma_v2_put_writes_total"); got != float64(len(sizes)) {
		t.Fatalf("v2 put writes %v, want %d; tcp batch puts %v refused %v mode %s", got, len(sizes), s.requests(fb.OpBatchPut), s.metric("dfkv_rdma_refused_total"), c.TransportMode())
	}

	// Exact into fresh buffers, scattered over three segments each, and auto into larger ones.
	exact := make([]client.Item, len(sizes))
	sg := make([]client.Item, len(sizes))
	auto := make([]client.Item, len(sizes))
	for i, n := range sizes {
		exact[i] = client.Item{Key: items[i].Key, Buf: make([]byte, n)}
		b := make([]byte, min(n+2, 64<<20))
		sg[i] = client.Item{Key: items[i].Key, Segs: [][]byte{b[:n/3], b[n/3 : n/3+1], b[n/3+1:]}}
		auto[i] = client.Item{Key: items[i].Key, Buf: make([]byte, min(n+100, 64<<20))}
	}
	if err := c.BatchGet(ctx, exact, client.Exact); err != nil {
		t.Fatal(err)
	}
	if err := c.BatchGet(ctx, sg, client.Auto); err != nil {
		t.Fatal(err)
	}
	if err := c.BatchGet(ctx, auto, client.Auto); err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		if exact[i].Err != nil || exact[i].N != int64(n) || !bytes.Equal(exact[i].Buf, vals[i]) {
			t.Fatalf("batch get exact %d bytes: %v n=%d", n, exact[i].Err, exact[i].N)
		}
		if sg[i].Err != nil || sg[i].N != int64(n) || !bytes.Equal(bytes.Join(sg[i].Segs, nil)[:n], vals[i]) {
			t.Fatalf("batch get sg %d bytes: %v n=%d", n, sg[i].Err, sg[i].N)
		}
		if auto[i].Err != nil || auto[i].N != int64(n) || !bytes.Equal(auto[i].Buf[:n], vals[i]) {
			t.Fatalf("batch get auto %d bytes: %v n=%d", n, auto[i].Err, auto[i].N)
		}
	}
	// Misses and size contracts, per item, in order.
	mixed := []client.Item{
		{Key: []byte("absent"), Buf: make([]byte, 10)},
		{Key: items[3].Key, Buf: make([]byte, sizes[3]-1)},                              // exact, one short
		{Key: items[3].Key, Buf: make([]byte, sizes[3]+1)},                              // exact, one long
		{Key: items[1].Key, Buf: make([]byte, sizes[1])},                                // hit
		{Key: items[5].Key, Segs: [][]byte{make([]byte, 32<<20), make([]byte, 32<<20)}}, // 64 MiB as two segments
	}
	if err := c.BatchGet(ctx, mixed, client.Exact); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(mixed[0].Err, client.ErrNotFound) || !errors.Is(mixed[1].Err, client.ErrBufferTooSmall) ||
		!errors.Is(mixed[2].Err, client.ErrBufferTooSmall) || mixed[3].Err != nil || !bytes.Equal(mixed[3].Buf, vals[1]) ||
		mixed[4].Err != nil || !bytes.Equal(bytes.Join(mixed[4].Segs, nil), vals[5]) {
		t.Fatalf("mixed batch get: %v / %v / %v / %v / %v", mixed[0].Err, mixed[1].Err, mixed[2].Err, mixed[3].Err, mixed[4].Err)
	}

	ex := make([]client.Item, len(sizes)+1)
	for i := range sizes {
		ex[i] = client.Item{Key: items[i].Key}
	}
	ex[len(sizes)] = client.Item{Key: []byte("absent")}
	if err := c.BatchExist(ctx, ex); err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		if ex[i].Err != nil || ex[i].N != int64(n) {
			t.Fatalf("batch exist %d bytes: %v n=%d", n, ex[i].Err, ex[i].N)
		}
	}
	if !errors.Is(ex[len(sizes)].Err, client.ErrNotFound) {
		t.Fatalf("batch exist of an absent key: %v", ex[len(sizes)].Err)
	}

	// Ranges and scalar scatter-gather, up to the 64 MiB value.
	for i, n := range sizes {
		off := n / 3
		buf := make([]byte, n-off)
		if err := c.GetRange(ctx, items[i].Key, uint64(off), buf); err != nil || !bytes.Equal(buf, vals[i][off:]) {
			t.Fatalf("range [%d,%d): %v", off, n, err)
		}
		key := []byte("sg" + strconv.Itoa(i))
		if err := c.PutSegs(ctx, key, [][]byte{vals[i][:n/2], vals[i][n/2:]}); err != nil {
			t.Fatalf("sg put %d: %v", n, err)
		}
		segs := [][]byte{make([]byte, n-n/4), make([]byte, n/4+5)}
		if m, err := c.GetAutoSegs(ctx, key, segs); err != nil || m != n || !bytes.Equal(bytes.Join(segs, nil)[:n], vals[i]) {
			t.Fatalf("sg get %d: %d %v", n, m, err)
		}
	}
	// The largest value, written by a batch over RDMA, reads back over plain TCP.
	tc, err := client.New(client.Options{Membership: ms, Namespace: []byte("rdma-batch"), IOTimeout: fabricTimeout(60 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, sizes[5])
	err = tc.Get(ctx, items[5].Key, got)
	tc.Close()
	if err != nil || !bytes.Equal(got, vals[5]) {
		t.Fatalf("64 MiB value put by an RDMA batch reads back differently over TCP: %v", err)
	}

	rm := []client.Item{{Key: items[0].Key}, {Key: []byte("absent")}}
	if err := c.BatchRemove(ctx, rm); err != nil {
		t.Fatal(err)
	}
	if rm[0].Err != nil || !errors.Is(rm[1].Err, client.ErrNotFound) {
		t.Fatalf("batch remove: %v / %v", rm[0].Err, rm[1].Err)
	}
	if _, err := c.Exist(ctx, items[0].Key); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("exist after batch remove: %v", err)
	}

	// Nothing of the batches went over TCP; the v2 counters moved on both ends.
	for _, op := range []fb.Op{fb.OpBatchPut, fb.OpBatchGet, fb.OpBatchExist, fb.OpBatchRemove, fb.OpGet, fb.OpPut} {
		want := 0.0
		if op == fb.OpGet {
			want = 1 // the TCP-only client's read-back
		}
		if n := s.requests(op); n != want {
			t.Fatalf("%d %s requests over TCP", int(n), fb.EnumNamesOp[op])
		}
	}
	snap := string(c.Snapshot())
	if s.metric("dfkv_rdma_v2_get_writes_total") == 0 || s.metric("dfkv_rdma_completion_errors_total") != 0 ||
		!strings.Contains(snap, "dfkv_rdma_completion_errors_total 0") || strings.Contains(snap, "dfkv_rdma_v2_put_writes_total 0") {
		t.Fatalf("counters: server get writes %v, client snapshot:\n%s", s.metric("dfkv_rdma_v2_get_writes_total"), snap)
	}
	if mode := c.TransportMode(); mode != "rdma" {
		t.Fatalf("transport mode %q", mode)
	}
}

// waitMetric polls until cond holds for the value read by get, or fails at the deadline.
func waitMetric(t *testing.T, what string, get func() float64, cond func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(fabricTimeout(30 * time.Second))
	for {
		v := get()
		if cond(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v at the deadline", what, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func snapshotValue(c *client.Client, name string) float64 {
	for _, l := range strings.Split(string(c.Snapshot()), "\n") {
		if strings.HasPrefix(l, name+" ") {
			v, _ := strconv.ParseFloat(l[len(name)+1:], 64)
			return v
		}
	}
	return -1
}

// Pooled RDMA connections idle past the idle timeout are closed: the client counts the
// reclaim, the server destroys the QP and returns the receive-segment lease; the next op
// opens a fresh connection. Close stops the reclaimer (no goroutine left behind).
func TestRDMAIdleReclaim(t *testing.T) {
	ctx := t.Context()
	s := startServer(t, t.TempDir(), rdmaArgs("--rdma-segment", "64MiB")...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, IOTimeout: fabricTimeout(30 * time.Second),
		RDMA: &client.RDMAOptions{Provider: rdmaProvider, MaxBlock: 1 << 20, IdleTimeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	segment := s.metric("dfkv_rdma_recv_segment_bytes")
	v := rnd(5000, 9)
	if err := c.Put(ctx, []byte("idle"), v); err != nil {
		t.Fatal(err)
	}
	if s.metric("dfkv_rdma_active_conns") != 1 || s.metric("dfkv_rdma_recv_segment_free_bytes") == segment {
		t.Fatal("no RDMA connection holding a lease after the put")
	}
	waitMetric(t, "client idle reclaims", func() float64 { return snapshotValue(c, "dfkv_rdma_idle_reclaims_total") }, func(v float64) bool { return v >= 1 })
	if got := snapshotValue(c, "dfkv_rdma_active_conns"); got != 0 {
		t.Fatalf("client active conns %v after the reclaim", got)
	}
	waitMetric(t, "server active conns", func() float64 { return s.metric("dfkv_rdma_active_conns") }, func(v float64) bool { return v == 0 })
	waitMetric(t, "server free segment", func() float64 { return s.metric("dfkv_rdma_recv_segment_free_bytes") }, func(v float64) bool { return v == segment })
	got := make([]byte, len(v))
	if err := c.Get(ctx, []byte("idle"), got); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get after the reclaim: %v", err)
	}
	if s.metric("dfkv_rdma_v2_conns_opened_total") != 2 {
		t.Fatalf("v2 conns opened %v, want 2 (one fresh after the reclaim)", s.metric("dfkv_rdma_v2_conns_opened_total"))
	}
	c.Close()
	buf := make([]byte, 1<<20)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "startJanitor") {
		t.Fatalf("the idle reclaimer outlived Close:\n%s", st)
	}
}

// SIGKILL of the server in the middle of a batch over RDMA: the call returns within the
// I/O deadline, every item is either its exact bytes or an unavailable/timeout error (never
// a zero-value Ok), and at least one item was cut off.
func TestRDMABatchServerKilled(t *testing.T) {
	ctx := t.Context()
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "512MiB", "--max-msg", "4MiB")...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, IOTimeout: fabricTimeout(5 * time.Second), BatchConcurrency: 1,
		RDMA: &client.RDMAOptions{Provider: rdmaProvider, Depth: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 32 items of 4 MiB keep the batch running when the kill lands; under emulation
	// (DFKV_TEST_FABRIC_SCALE > 1: the guest is ~20x slower) 8 do, in a fraction of the time.
	n, size := 32, 4<<20
	if fabricScale > 1 {
		n = 8
	}
	items := make([]client.Item, n)
	vals := make([][]byte, n)
	for i := range items {
		vals[i] = rnd(size, uint64(300+i))
		items[i] = client.Item{Key: []byte("k" + strconv.Itoa(i)), Value: vals[i]}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if items[i].Err != nil {
			t.Fatalf("put %d: %v", i, items[i].Err)
		}
		items[i] = client.Item{Key: items[i].Key, Buf: make([]byte, size)}
	}
	before := s.metric("dfkv_rdma_v2_get_writes_total")
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		c.BatchGet(ctx, items, client.Exact)
		done <- time.Since(start)
	}()
	waitMetric(t, "first GET write of the batch", func() float64 { return s.metric("dfkv_rdma_v2_get_writes_total") }, func(v float64) bool { return v > before })
	s.kill()
	var took time.Duration
	select {
	case took = <-done:
	case <-time.After(fabricTimeout(60 * time.Second)):
		t.Fatal("BatchGet hung after the server was killed")
	}
	failed := 0
	for i, it := range items {
		switch {
		case it.Err == nil:
			if !bytes.Equal(it.Buf, vals[i]) {
				t.Fatalf("item %d: Ok with wrong bytes", i)
			}
		case errors.Is(it.Err, client.ErrUnavailable) || errors.Is(it.Err, client.ErrTimeout):
			failed++
		default:
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	if failed == 0 {
		t.Fatal("every item completed: the kill did not land mid-batch")
	}
	t.Logf("batch returned %v after the start, %d of %d items cut off", took, failed, n)
}
