package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// lockedBuf is an io.Writer the test reads while the access log writes.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.b.Bytes()...)
}

type accessRec struct {
	Msg       string `json:"msg"`
	Op        string `json:"op"`
	Tenant    string `json:"tenant"`
	KeyHash   string `json:"key_hash"`
	Size      uint64 `json:"size"`
	Sent      uint64 `json:"sent"`
	Status    string `json:"status"`
	LatencyUS *int64 `json:"latency_us"`
	Peer      string `json:"peer"`
	Items     uint64 `json:"items"`
	ItemsOK   uint64 `json:"items_ok"`
}

func parseAccess(t *testing.T, b []byte) []accessRec {
	t.Helper()
	var out []accessRec
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r accessRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("access log line is not JSON: %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestAccessLogRecords(t *testing.T) {
	var buf lockedBuf
	al, err := server.NewAccessLog(&buf, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, server.Config{AccessLog: al})
	c := newClient(t, n.addr, "ns")
	secret := []byte("secret-user-prompt-key-0123")
	val := bytes.Repeat([]byte{7}, 5000)
	if err := c.Put(context.Background(), secret, val); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(val))
	if err := c.Get(context.Background(), secret, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("get: %v", err)
	}
	if err := c.Get(context.Background(), []byte("secret-missing-key"), got); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("missing get: %v", err)
	}
	items := []client.Item{{Key: secret, Buf: make([]byte, len(val))}, {Key: []byte("secret-missing-2"), Buf: make([]byte, 1)}}
	if err := c.BatchGet(context.Background(), items, client.Exact); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// As dfkv_server does: drain the connections (each logs its last request after
	// flushing the reply), then close the log.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := al.Close(); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	for _, k := range []string{"secret-user-prompt-key", "secret-missing", fmt.Sprintf("%x", secret)} {
		if bytes.Contains(raw, []byte(k)) {
			t.Fatalf("access log contains the raw key %q:\n%s", k, raw)
		}
	}
	recs := parseAccess(t, raw)
	id := identity.Object([]byte("ns"), secret).String()
	find := func(op, status string) accessRec {
		t.Helper()
		for _, r := range recs {
			if r.Op == op && r.Status == status {
				return r
			}
		}
		t.Fatalf("no %s/%s record in\n%s", op, status, raw)
		return accessRec{}
	}
	put := find("Put", "Ok")
	if put.Msg != "access" || put.KeyHash != id || put.Size != 5000 || put.Sent != 0 || put.LatencyUS == nil || put.Peer == "" || put.Tenant == "" {
		t.Fatalf("put record %+v (want key_hash %s)", put, id)
	}
	get := find("Get", "Ok")
	if get.KeyHash != id || get.Sent != 5000 || get.Size != 0 {
		t.Fatalf("get record %+v", get)
	}
	miss := find("Get", "NotFound")
	if miss.Sent != 0 || miss.KeyHash == id || len(miss.KeyHash) != 32 {
		t.Fatalf("miss record %+v", miss)
	}
	// The client may split a batch; the hit is in one BatchGet record with its bytes, and
	// every item is accounted for once.
	var nItems, itemsOK, sent uint64
	for _, r := range recs {
		if r.Op == "BatchGet" {
			if r.Status != "Ok" || r.KeyHash != "" || r.Items == 0 {
				t.Fatalf("batch record %+v", r)
			}
			nItems, itemsOK, sent = nItems+r.Items, itemsOK+r.ItemsOK, sent+r.Sent
		}
	}
	if nItems != 2 || itemsOK != 1 || sent != 5000 {
		t.Fatalf("batch records: %d items, %d ok, %d bytes sent; want 2, 1, 5000\n%s", nItems, itemsOK, sent, raw)
	}
}

func TestAccessLogSampling(t *testing.T) {
	if _, err := server.NewAccessLog(&lockedBuf{}, 0); err == nil {
		t.Fatal("sample rate 0 accepted")
	}
	var buf lockedBuf
	al, err := server.NewAccessLog(&buf, 10)
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, server.Config{AccessLog: al})
	c := newClient(t, n.addr, "ns")
	for i := 0; i < 100; i++ {
		if err := c.Put(context.Background(), []byte(fmt.Sprint("k", i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := al.Close(); err != nil {
		t.Fatal(err)
	}
	puts := 0
	for _, r := range parseAccess(t, buf.Bytes()) {
		if r.Op == "Put" {
			puts++
		}
	}
	// 1 in 10 requests per connection (a Hello also counts); the client may use more than one connection.
	if puts < 8 || puts > 14 {
		t.Fatalf("logged %d of 100 puts at 1-in-10 sampling", puts)
	}
}

// BenchmarkWarmGetAccessLog measures warm single-key GETs (RAM engine, 2×GOMAXPROCS
// concurrent loopback callers) against two servers side by side: one without an access log
// and one logging every request to a file. The two are driven in alternating rounds so
// machine noise hits both alike; wall-full/off is the logged server's throughput as a
// fraction of the plain one's, cpu-full/off the same for process CPU per GET (client and
// both servers share the process). 1 MiB is dfkv's headline warm GET; 4 KiB the worst case
// for a per-request cost (docs/BENCHMARKS.md).
func BenchmarkWarmGetAccessLog(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) { benchWarmGetAccessLog(b, size) })
	}
}

func benchWarmGetAccessLog(b *testing.B, size int) {
	sink, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	al, err := server.NewAccessLog(sink, 1)
	if err != nil {
		b.Fatal(err)
	}
	val := bytes.Repeat([]byte{1}, size)
	keys := min(256, (32<<20)/size)
	setup := func(cfg server.Config) *client.Client {
		cfg.Engine = store.NewMem(64 << 20)
		n := startNodeB(b, cfg)
		ms, _ := client.NewStatic([]client.Member{{ID: "n1", Addr: n.addr, Weight: 1}})
		c, err := client.New(client.Options{Membership: ms, Namespace: []byte("bench")})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		for i := 0; i < keys; i++ {
			if err := c.Put(context.Background(), []byte(fmt.Sprint("k", i)), val); err != nil {
				b.Fatal(err)
			}
		}
		return c
	}
	off, full := setup(server.Config{}), setup(server.Config{AccessLog: al})
	workers := 2 * runtime.GOMAXPROCS(0)
	// round returns wall time and process CPU time (user+system): the machine may be shared,
	// and CPU per request is the steadier measure of what logging costs a CPU-bound node.
	round := func(c *client.Client, n int) (time.Duration, time.Duration) {
		var wg sync.WaitGroup
		cpu0 := cpuTime(b)
		start := time.Now()
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				buf := make([]byte, len(val))
				for i := w; i < n; i += workers {
					if err := c.Get(context.Background(), []byte(fmt.Sprint("k", i%keys)), buf); err != nil {
						b.Error(err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		return time.Since(start), cpuTime(b) - cpu0
	}
	round(off, 200) // warm both: connections, pools
	round(full, 200)
	const rounds = 40
	per := max(b.N/rounds, workers)
	var tOff, tFull, cOff, cFull time.Duration
	add := func(t, c *time.Duration, dt, dc time.Duration) { *t += dt; *c += dc }
	b.SetBytes(int64(size))
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		if r%2 == 0 {
			dt, dc := round(off, per)
			add(&tOff, &cOff, dt, dc)
			dt, dc = round(full, per)
			add(&tFull, &cFull, dt, dc)
		} else {
			dt, dc := round(full, per)
			add(&tFull, &cFull, dt, dc)
			dt, dc = round(off, per)
			add(&tOff, &cOff, dt, dc)
		}
	}
	b.StopTimer()
	ops := float64(per * rounds)
	b.ReportMetric(float64(tOff.Nanoseconds())/ops, "ns/get-off")
	b.ReportMetric(float64(tFull.Nanoseconds())/ops, "ns/get-full")
	b.ReportMetric(float64(cOff.Nanoseconds())/ops, "cpu-ns/get-off")
	b.ReportMetric(float64(cFull.Nanoseconds())/ops, "cpu-ns/get-full")
	b.ReportMetric(tOff.Seconds()/tFull.Seconds(), "wall-full/off")
	b.ReportMetric(cOff.Seconds()/cFull.Seconds(), "cpu-full/off")
	if err := al.Close(); err != nil {
		b.Fatal(err)
	}
	if st, err := sink.Stat(); err != nil || st.Size() == 0 {
		b.Fatalf("access log wrote nothing (%v)", err)
	}
}

// BenchmarkAccessRecord is the cost of one record alone (formatting and buffering).
func BenchmarkAccessRecord(b *testing.B) {
	al, err := server.NewAccessLog(io.Discard, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer al.Close()
	log := server.AccessLoggerForTest(al)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		log()
	}
}

func startNodeB(b *testing.B, cfg server.Config) *node {
	srv, err := server.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	n := &node{srv: srv, addr: ln.Addr().String(), eng: cfg.Engine, done: make(chan error, 1)}
	go func() { n.done <- srv.Serve(ln) }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return n
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestAccessLineIsSlogJSON holds the access log's hand-rendered line equal to what
// slog.NewJSONHandler writes for the same attributes (the timestamp compared as a time).
func TestAccessLineIsSlogJSON(t *testing.T) {
	cases := []struct {
		req         wire.Request
		peer        string
		st          fb.Status
		sent        uint64
		items, ok   uint32
		d           time.Duration
		wantKeyHash string
	}{
		{wire.Request{Op: fb.OpGet, Tenant: 0xabc, ID: identity.ObjectID{Hi: 0x0123456789abcdef, Lo: 0xfedcba9876543210}}, "127.0.0.1:5000", fb.StatusOk, 4096, 0, 0, 1500 * time.Microsecond, "0123456789abcdeffedcba9876543210"},
		{wire.Request{Op: fb.OpPut, PayloadLen: 1 << 20, ID: identity.ObjectID{Lo: 1}}, `[::1]:7 "odd\peer"<&>`, fb.StatusQuotaExceeded, 0, 0, 0, 0, "00000000000000000000000000000001"},
		{wire.Request{Op: fb.OpBatchGet, Tenant: ^uint64(0), PayloadLen: 80}, "10.0.0.1:1", fb.StatusOk, 300, 2, 1, time.Second, ""},
	}
	for i, tc := range cases {
		var got lockedBuf
		al, err := server.NewAccessLog(&got, 1)
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		server.AccessLineForTest(al, &tc.req, tc.peer, tc.st, tc.sent, tc.items, tc.ok, tc.d)
		after := time.Now()
		if err := al.Close(); err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		attrs := []slog.Attr{
			slog.String("op", fb.EnumNamesOp[tc.req.Op]), slog.String("tenant", strconv.FormatUint(tc.req.Tenant, 16)),
			slog.String("key_hash", tc.wantKeyHash), slog.Uint64("size", tc.req.PayloadLen), slog.Uint64("sent", tc.sent),
			slog.String("status", fb.EnumNamesStatus[tc.st]), slog.Int64("latency_us", tc.d.Microseconds()), slog.String("peer", tc.peer),
		}
		if tc.items > 0 {
			attrs = append(attrs, slog.Uint64("items", uint64(tc.items)), slog.Uint64("items_ok", uint64(tc.ok)))
		}
		slog.New(slog.NewJSONHandler(&want, nil)).LogAttrs(context.Background(), slog.LevelInfo, "access", attrs...)
		var g, w map[string]any
		if err := json.Unmarshal(got.Bytes(), &g); err != nil {
			t.Fatalf("case %d: %q: %v", i, got.Bytes(), err)
		}
		if err := json.Unmarshal(want.Bytes(), &w); err != nil {
			t.Fatal(err)
		}
		ts, err := time.Parse(time.RFC3339Nano, g["time"].(string))
		if err != nil || ts.Before(before.Truncate(time.Microsecond)) || ts.After(after) {
			t.Fatalf("case %d: time %v not in [%v, %v] (%v)", i, g["time"], before, after, err)
		}
		delete(g, "time")
		delete(w, "time")
		if diff := cmp.Diff(w, g); diff != "" {
			t.Fatalf("case %d: access line differs from slog's JSON (-slog +ours):\n%s\nours: %s", i, diff, got.Bytes())
		}
		if bytes.Count(got.Bytes(), []byte("\n")) != 1 {
			t.Fatalf("case %d: want exactly one line: %q", i, got.Bytes())
		}
	}
}
