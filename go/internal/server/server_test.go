package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

type node struct {
	srv  *server.Server
	addr string
	eng  store.Engine
	done chan error
}

func startNode(t *testing.T, cfg server.Config) *node {
	t.Helper()
	if cfg.Engine == nil {
		cfg.Engine = store.NewMem(256 << 20)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{srv: srv, addr: ln.Addr().String(), eng: cfg.Engine, done: make(chan error, 1)}
	go func() { n.done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return n
}

func newClient(t *testing.T, addr string, ns string) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte(ns), IOTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestSingleOps(t *testing.T) {
	n := startNode(t, server.Config{})
	c := newClient(t, n.addr, "ns")
	r := rand.New(rand.NewPCG(1, 2))
	val := randBytes(r, 100000)
	key := []byte("k\x00bin")
	if err := c.Put(context.Background(), key, val); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(val))
	if err := c.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("get: %v", err)
	}
	if err := c.Get(context.Background(), key, make([]byte, len(val)-1)); !errors.Is(err, client.ErrBufferTooSmall) {
		t.Fatalf("exact get with wrong size: %v", err)
	}
	big := make([]byte, len(val)+10)
	if m, err := c.GetAuto(context.Background(), key, big); err != nil || m != len(val) || !bytes.Equal(big[:m], val) {
		t.Fatalf("get auto: %d %v", m, err)
	}
	if _, err := c.GetAuto(context.Background(), key, make([]byte, 10)); !errors.Is(err, client.ErrBufferTooSmall) {
		t.Fatalf("get auto cap too small: %v", err)
	}
	part := make([]byte, 1000)
	if err := c.GetRange(context.Background(), key, 500, part); err != nil || !bytes.Equal(part, val[500:1500]) {
		t.Fatalf("range: %v", err)
	}
	if err := c.GetRange(context.Background(), key, uint64(len(val)-10), part); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("range past end: %v", err)
	}
	if sz, err := c.Exist(context.Background(), key); err != nil || sz != int64(len(val)) {
		t.Fatalf("exist: %d %v", sz, err)
	}
	// Same key, other namespace: another object.
	other := newClient(t, n.addr, "other")
	if _, err := other.Exist(context.Background(), key); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("namespace isolation: %v", err)
	}
	if err := c.Put(context.Background(), key, nil); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("empty put: %v", err)
	}
	if err := c.Remove(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(context.Background(), key); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if err := c.Get(context.Background(), key, got); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	if err := c.Ping(context.Background(), n.addr); err != nil {
		t.Fatal(err)
	}
	st, err := c.NodeStats(context.Background(), n.addr)
	if err != nil || st["store_objects"] != 0 || st["store_write_bytes"] != float64(len(val)) {
		t.Fatalf("stats: %v %v", st, err)
	}
}

func TestBatchesAndScatterGather(t *testing.T) {
	n := startNode(t, server.Config{})
	c := newClient(t, n.addr, "ns")
	r := rand.New(rand.NewPCG(3, 4))
	const N = 40
	items := make([]client.Item, N)
	vals := make([][]byte, N)
	for i := range items {
		vals[i] = randBytes(r, 1+r.IntN(200000))
		items[i] = client.Item{Key: []byte{byte(i), 0, byte(i)}, Value: vals[i]}
	}
	items[7].Value = nil // invalid item fails alone
	if err := c.BatchPut(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if (items[i].Err == nil) != (i != 7) {
			t.Fatalf("put item %d: %v", i, items[i].Err)
		}
	}
	gets := make([]client.Item, N+1)
	for i := 0; i < N; i++ {
		gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, len(vals[i]))}
	}
	gets[N] = client.Item{Key: []byte("missing"), Buf: make([]byte, 10)}
	if err := c.BatchGet(context.Background(), gets, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < N; i++ {
		if i == 7 {
			if !errors.Is(gets[i].Err, client.ErrNotFound) {
				t.Fatalf("item 7 should miss: %v", gets[i].Err)
			}
			continue
		}
		if gets[i].Err != nil || !bytes.Equal(gets[i].Buf, vals[i]) {
			t.Fatalf("batch get %d: %v", i, gets[i].Err)
		}
	}
	if !errors.Is(gets[N].Err, client.ErrNotFound) {
		t.Fatalf("missing key: %v", gets[N].Err)
	}
	// Scatter-gather with uneven segments: put from 3 segments, read into 4 others.
	whole := randBytes(r, 70001)
	sg := []client.Item{{Key: []byte("sg"), Segs: [][]byte{whole[:1], whole[1:40000], whole[40000:]}}}
	if err := c.BatchPut(context.Background(), sg); err != nil || sg[0].Err != nil {
		t.Fatalf("sg put: %v %v", err, sg[0].Err)
	}
	out := [][]byte{make([]byte, 3), make([]byte, 50000), make([]byte, 7), make([]byte, 30000)}
	sgGet := []client.Item{{Key: []byte("sg"), Segs: out}}
	if err := c.BatchGet(context.Background(), sgGet, client.Auto); err != nil || sgGet[0].Err != nil || sgGet[0].N != int64(len(whole)) {
		t.Fatalf("sg get: %v %v %d", err, sgGet[0].Err, sgGet[0].N)
	}
	if !bytes.Equal(bytes.Join(out, nil)[:len(whole)], whole) {
		t.Fatal("sg bytes differ")
	}
	ex := []client.Item{{Key: items[0].Key}, {Key: []byte("missing")}}
	if err := c.BatchExist(context.Background(), ex); err != nil || ex[0].Err != nil || ex[0].N != int64(len(vals[0])) || !errors.Is(ex[1].Err, client.ErrNotFound) {
		t.Fatalf("batch exist: %v %v", ex[0].Err, ex[1].Err)
	}
	// The mem engine has no lease table: a leased lookup answers hits without a lease.
	if err := c.BatchExistLease(context.Background(), ex, time.Second); err != nil || ex[0].Err != nil || ex[0].Leased ||
		ex[0].N != int64(len(vals[0])) || !errors.Is(ex[1].Err, client.ErrNotFound) {
		t.Fatalf("batch exist lease: %v leased=%v %v", ex[0].Err, ex[0].Leased, ex[1].Err)
	}
	if err := c.BatchRemove(context.Background(), ex); err != nil || ex[0].Err != nil || !errors.Is(ex[1].Err, client.ErrNotFound) {
		t.Fatalf("batch remove: %v %v", ex[0].Err, ex[1].Err)
	}
}

// rawConn speaks the wire directly for malformed-frame tests.
type rawConn struct {
	t  *testing.T
	nc net.Conn
}

func dialRaw(t *testing.T, addr string) *rawConn {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	return &rawConn{t: t, nc: nc}
}

func (r *rawConn) send(req wire.Request, payload []byte) {
	var b [wire.RequestSize]byte
	req.Encode(b[:])
	if _, err := r.nc.Write(append(b[:], payload...)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) recv() (wire.Response, error) {
	var b [wire.ResponseSize]byte
	if _, err := io.ReadFull(r.nc, b[:]); err != nil {
		return wire.Response{}, err
	}
	return wire.DecodeResponse(b[:])
}

// closed reports whether the server closed the connection (a timeout is not a close).
func (r *rawConn) closed() bool {
	var b [1]byte
	_, err := r.nc.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

func TestMalformedFramesLeaveServerServing(t *testing.T) {
	limits := wire.DefaultLimits()
	limits.MaxValue = 1 << 20
	limits.MaxFrame = 8 << 20
	n := startNode(t, server.Config{Limits: limits})
	healthy := newClient(t, n.addr, "ns")
	check := func(step string) {
		t.Helper()
		k := []byte("probe-" + step)
		if err := healthy.Put(context.Background(), k, []byte(step)); err != nil {
			t.Fatalf("after %s: server not serving: %v", step, err)
		}
		buf := make([]byte, len(step))
		if err := healthy.Get(context.Background(), k, buf); err != nil || string(buf) != step {
			t.Fatalf("after %s: get: %v", step, err)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))

	t.Run("random garbage closes only that connection", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			rc := dialRaw(t, n.addr)
			junk := randBytes(r, 1+r.IntN(300))
			_, _ = rc.nc.Write(junk)
			if len(junk) < wire.RequestSize {
				// Not even a whole prefix: the server is still waiting for one, so end the
				// stream; a truncated prefix must close the connection, not wedge it.
				_ = rc.nc.(*net.TCPConn).CloseWrite()
			}
			if !rc.closed() {
				t.Fatalf("garbage of %d bytes accepted", len(junk))
			}
		}
		check("garbage")
	})
	t.Run("truncated prefix then hang up", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		var b [wire.RequestSize]byte
		(&wire.Request{Op: fb.OpPut, PayloadLen: 100}).Encode(b[:])
		_, _ = rc.nc.Write(b[:20])
		rc.nc.Close()
		rc2 := dialRaw(t, n.addr)
		rc2.send(wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 1}, PayloadLen: 100}, make([]byte, 50))
		rc2.nc.Close() // truncated payload
		check("truncated")
	})
	t.Run("unknown op is Invalid and the stream goes on", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		rc.send(wire.Request{Op: 99, PayloadLen: 10}, make([]byte, 10))
		resp, err := rc.recv()
		if err != nil || resp.Status != fb.StatusInvalid {
			t.Fatalf("unknown op reply: %+v %v", resp, err)
		}
		rc.send(wire.Request{Op: fb.OpPing}, nil)
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusOk || resp.Op != fb.OpPing {
			t.Fatalf("ping after unknown op: %+v %v", resp, err)
		}
		check("unknown-op")
	})
	t.Run("oversized value is Invalid and drained", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		big := make([]byte, limits.MaxValue+1)
		rc.send(wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 2}, PayloadLen: uint64(len(big))}, big)
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusInvalid {
			t.Fatalf("oversized reply: %+v %v", resp, err)
		}
		rc.send(wire.Request{Op: fb.OpPing}, nil)
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusOk {
			t.Fatalf("ping after oversized: %+v %v", resp, err)
		}
		check("oversized")
	})
	t.Run("frame beyond the cap closes", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		rc.send(wire.Request{Op: fb.OpPut, PayloadLen: limits.MaxFrame + 1}, nil)
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusInvalid {
			t.Fatalf("reply: %+v %v", resp, err)
		}
		if !rc.closed() {
			t.Fatal("connection kept after a frame beyond the cap")
		}
		check("frame-cap")
	})
	t.Run("batch put whose items overrun the frame closes", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		var item [wire.BatchItemSize]byte
		(&wire.BatchItem{ID: identity.ObjectID{Hi: 3}, Length: 1000}).Encode(item[:])
		rc.send(wire.Request{Op: fb.OpBatchPut, Count: 1, PayloadLen: wire.BatchItemSize + 10}, append(item[:], make([]byte, 10)...))
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusInvalid {
			t.Fatalf("reply: %+v %v", resp, err)
		}
		if !rc.closed() {
			t.Fatal("desynced connection kept")
		}
		check("batch-desync")
	})
	t.Run("wrong protocol version closes", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		rc.send(wire.Request{Op: fb.OpPing, Version: 77}, nil)
		if resp, err := rc.recv(); err == nil && resp.Status != fb.StatusInvalid {
			t.Fatalf("reply: %+v", resp)
		}
		if !rc.closed() {
			t.Fatal("version mismatch kept")
		}
		check("version")
	})
	t.Run("sg geometry mismatch is Invalid", func(t *testing.T) {
		rc := dialRaw(t, n.addr)
		var segs [16]byte
		wire.PutSgSegs(segs[:], []uint64{5, 5})
		rc.send(wire.Request{Op: fb.OpSgPut, Count: 2, ID: identity.ObjectID{Hi: 4}, PayloadLen: 16 + 7}, append(segs[:], make([]byte, 7)...))
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusInvalid {
			t.Fatalf("reply: %+v %v", resp, err)
		}
		wire.PutSgSegs(segs[:], []uint64{3, 4})
		rc.send(wire.Request{Op: fb.OpSgPut, Count: 2, ID: identity.ObjectID{Hi: 4}, PayloadLen: 16 + 7}, append(segs[:], []byte("abcdefg")...))
		if resp, err := rc.recv(); err != nil || resp.Status != fb.StatusOk {
			t.Fatalf("sg put: %+v %v", resp, err)
		}
		rc.send(wire.Request{Op: fb.OpSgGet, Count: 2, ID: identity.ObjectID{Hi: 4}, PayloadLen: 16}, segs[:])
		resp, err := rc.recv()
		if err != nil || resp.Status != fb.StatusOk || resp.PayloadLen != 7 {
			t.Fatalf("sg get: %+v %v", resp, err)
		}
		got := make([]byte, 7)
		if _, err := io.ReadFull(rc.nc, got); err != nil || string(got) != "abcdefg" {
			t.Fatalf("sg get payload %q %v", got, err)
		}
		check("sg")
	})
}

func TestPipelinedRepliesInOrder(t *testing.T) {
	n := startNode(t, server.Config{})
	rc := dialRaw(t, n.addr)
	const N = 200
	var frames []byte
	var b [wire.RequestSize]byte
	for i := 0; i < N; i++ {
		(&wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: uint64(i) + 1}, PayloadLen: 4}).Encode(b[:])
		frames = append(frames, b[:]...)
		frames = append(frames, byte(i), 1, 2, 3)
		(&wire.Request{Op: fb.OpExist, ID: identity.ObjectID{Hi: uint64(i) + 1}}).Encode(b[:])
		frames = append(frames, b[:]...)
	}
	go func() { _, _ = rc.nc.Write(frames) }()
	for i := 0; i < N; i++ {
		for _, op := range []fb.Op{fb.OpPut, fb.OpExist} {
			resp, err := rc.recv()
			if err != nil || resp.Op != op || resp.Status != fb.StatusOk {
				t.Fatalf("reply %d/%v: %+v %v", i, op, resp, err)
			}
			if op == fb.OpExist && resp.ValueLen != 4 {
				t.Fatalf("exist %d: %+v", i, resp)
			}
		}
	}
}

func TestConnectionCapAndFirstRequestDeadline(t *testing.T) {
	n := startNode(t, server.Config{MaxConns: 2, FirstRequestTimeout: 200 * time.Millisecond})
	a, b := dialRaw(t, n.addr), dialRaw(t, n.addr)
	a.send(wire.Request{Op: fb.OpPing}, nil)
	b.send(wire.Request{Op: fb.OpPing}, nil)
	for _, rc := range []*rawConn{a, b} {
		if _, err := rc.recv(); err != nil {
			t.Fatal(err)
		}
	}
	third := dialRaw(t, n.addr)
	if !third.closed() {
		t.Fatal("connection beyond the cap was served")
	}
	a.nc.Close()
	// A silent connection is dropped after the first-request deadline.
	deadline := time.Now().Add(3 * time.Second)
	var silent *rawConn
	for time.Now().Before(deadline) {
		silent = dialRaw(t, n.addr)
		start := time.Now()
		if silent.closed() && time.Since(start) >= 150*time.Millisecond {
			return
		}
		time.Sleep(50 * time.Millisecond) // the slot freed by a may not be released yet
	}
	t.Fatal("silent connection was not dropped after the first-request deadline")
}

// slowEngine blocks Gets until released, to observe draining.
type slowEngine struct {
	store.Engine
	entered chan struct{}
	release chan struct{}
}

func (s *slowEngine) Get(k store.Key, fn func([]byte) error) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Engine.Get(k, fn)
}

func TestShutdownDrainsInFlight(t *testing.T) {
	eng := &slowEngine{Engine: store.NewMem(1 << 20), entered: make(chan struct{}, 1), release: make(chan struct{})}
	n := startNode(t, server.Config{Engine: eng})
	c := newClient(t, n.addr, "")
	if err := c.Put(context.Background(), []byte("k"), []byte("value")); err != nil {
		t.Fatal(err)
	}
	idle := dialRaw(t, n.addr)
	idle.send(wire.Request{Op: fb.OpPing}, nil)
	if _, err := idle.recv(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var getErr error
	buf := make([]byte, 5)
	wg.Add(1)
	go func() { defer wg.Done(); getErr = c.Get(context.Background(), []byte("k"), buf) }()
	<-eng.entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- n.srv.Shutdown(ctx)
	}()
	if !idle.closed() {
		t.Fatal("idle connection not closed by drain")
	}
	select {
	case <-shut:
		t.Fatal("shutdown returned before the in-flight request finished")
	case <-time.After(100 * time.Millisecond):
	}
	close(eng.release)
	wg.Wait()
	if getErr != nil || string(buf) != "value" {
		t.Fatalf("in-flight get during drain: %v %q", getErr, buf)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := <-n.done; !errors.Is(err, server.ErrServerClosed) {
		t.Fatalf("serve returned %v", err)
	}
}

// TestDeadlinesAfterBusyStretch: the read deadlines are re-armed lazily (once per eighth of
// their window, not per request), so a connection that has just served a burst of requests
// must still be cut off when it then stalls mid-payload or falls silent: never early by more
// than an eighth of the timeout, never hanging past it.
func TestDeadlinesAfterBusyStretch(t *testing.T) {
	const ioTimeout, idle = 400 * time.Millisecond, 800 * time.Millisecond
	n := startNode(t, server.Config{IOTimeout: ioTimeout, IdleTimeout: idle})
	busy := func(rc *rawConn) {
		for i := 0; i < 300; i++ {
			rc.send(wire.Request{Op: fb.OpPing}, nil)
			if _, err := rc.recv(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		then func(rc *rawConn)
		min  time.Duration
	}{
		{"stalled payload", func(rc *rawConn) {
			rc.send(wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 7}, PayloadLen: 4096}, make([]byte, 10))
		}, ioTimeout - ioTimeout/8},
		{"silent", func(*rawConn) {}, idle - idle/8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, n.addr)
			busy(rc)
			start := time.Now()
			tc.then(rc)
			if !rc.closed() { // dialRaw's 5 s client deadline ran out first
				t.Fatalf("connection still open %v after it stalled", time.Since(start))
			}
			if took := time.Since(start); took < tc.min-20*time.Millisecond {
				t.Fatalf("closed after %v, before the %v deadline", took, tc.min)
			}
		})
	}
}
