package onesided

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/testutil"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// countConn counts the bytes a bootstrap connection carries each way.
type countConn struct {
	net.Conn
	r, w atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.r.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.w.Add(int64(n))
	return n, err
}

// countingServer serves like startServer, wrapping each accepted connection in a countConn.
type countingServer struct {
	*testServer
	conns chan *countConn
}

func startCountingServer(t *testing.T, cfg Config, eng store.Engine) *countingServer {
	t.Helper()
	s, err := NewServer(cfg, eng)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingServer{testServer: &testServer{s: s, ln: ln, errs: make(chan error, 100)}, conns: make(chan *countConn, 100)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cc := &countConn{Conn: c}
			cs.conns <- cc
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				cs.errs <- s.Serve(context.Background(), cc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.Close()
		wg.Wait()
	})
	return cs
}

func dialCounting(t *testing.T, cs *countingServer, cfg Config) (*Client, *countConn, *countConn) {
	t.Helper()
	nc, err := net.Dial("tcp", cs.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc := &countConn{Conn: nc}
	c, err := Dial(cc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case sc := <-cs.conns:
		// The counts settle once each end's writes are all read by the other.
		waitFor(t, "the bootstrap exchange counted", func() bool { return sc.w.Load() == cc.r.Load() && cc.w.Load() == sc.r.Load() })
		return c, cc, sc
	case <-time.After(10 * time.Second):
		t.Fatal("server never accepted")
	}
	return nil, nil, nil
}

// recorder collects application notifications.
type recorder struct {
	mu   sync.Mutex
	msgs map[string][][]byte
	ch   chan struct{}
}

func newRecorder() *recorder {
	return &recorder{msgs: map[string][][]byte{}, ch: make(chan struct{}, 1<<12)}
}

func (r *recorder) handle(name string, body []byte) {
	r.mu.Lock()
	r.msgs[name] = append(r.msgs[name], bytes.Clone(body))
	r.mu.Unlock()
	r.ch <- struct{}{}
}

func (r *recorder) wait(t *testing.T, name string, n int) [][]byte {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		got := append([][]byte(nil), r.msgs[name]...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("%d of %d %q notifications", len(got), n, name)
		}
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, what, cond)
}

// TestNotifyNoBootstrapTraffic: with native notifications on both ends, the RDMA data path
// (PUT/GET windows), application notifications both ways, the server's drain notice and the
// client's goodbye put not one byte on the bootstrap TCP connection after the DCP exchange,
// on either end. (The same run over TCP fallback, TestNotifyFallbackOverTCP, does.)
func TestNotifyNoBootstrapTraffic(t *testing.T) {
	for _, v1 := range []bool{false, true} {
		name := "v2"
		if v1 {
			name = "v1"
		}
		t.Run(name, func(t *testing.T) {
			p := softProvider(t, soft.Options{Devices: 2})
			srvRec, cliRec := newRecorder(), newRecorder()
			nc := NotifyConfig{Enabled: true, OOBFallback: true}
			scfg := Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 4, Notify: nc}
			scfg.Notify.Handler = srvRec.handle
			cs := startCountingServer(t, scfg, store.NewMem(1<<28))
			ccfg := Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 4, Notify: nc, ForceV1: v1}
			ccfg.Notify.Handler = cliRec.handle
			c, cc, sc := dialCounting(t, cs, ccfg)
			if c.nep == nil {
				t.Fatal("no native notification endpoint negotiated")
			}
			cr, cw, sr, sw := cc.r.Load(), cc.w.Load(), sc.r.Load(), sc.w.Load()
			ctx := context.Background()
			for i := range 16 {
				v := randBytes(1000+i*4099, uint64(i))
				put := &Op{Kind: fb.OpPut, ID: oid(i), Value: [][]byte{v}}
				dst := make([]byte, len(v))
				get := &Op{Kind: fb.OpGet, ID: oid(i), Dst: [][]byte{dst}}
				if err := c.Do(ctx, []*Op{put, get}); err != nil || put.Status != fb.StatusOk || get.Status != fb.StatusOk ||
					crc32.ChecksumIEEE(dst) != crc32.ChecksumIEEE(v) {
					t.Fatalf("op %d: %v %s %s", i, err, put.Status, get.Status)
				}
				// A completion notice for the op, natively.
				if err := c.Notify(ctx, "app.done", []byte{byte(i)}); err != nil {
					t.Fatal(err)
				}
			}
			got := srvRec.wait(t, "app.done", 16)
			for i, b := range got {
				if len(b) != 1 || b[0] != byte(i) {
					t.Fatalf("notice %d: %v", i, b)
				}
			}
			if sent, err := cs.s.Broadcast(ctx, "app.event", []byte("segment moved")); err != nil || sent != 1 {
				t.Fatalf("broadcast: %d, %v", sent, err)
			}
			if b := cliRec.wait(t, "app.event", 1); string(b[0]) != "segment moved" {
				t.Fatalf("event %q", b[0])
			}
			// The server goes away: the client hears it natively before any op fails.
			cs.s.Close()
			waitFor(t, "the drain notice", c.Draining)
			if d := [4]int64{cc.r.Load() - cr, cc.w.Load() - cw, sc.r.Load() - sr, sc.w.Load() - sw}; d != [4]int64{} {
				t.Fatalf("bootstrap TCP bytes after the exchange (client read, written; server read, written): %v", d)
			}
			for _, m := range []*Metrics{c.M, &cs.s.M} {
				if m.Notify.Fallbacks.Load() != 0 || m.Notify.Sends.Load() == 0 {
					t.Fatalf("sends %d fallbacks %d", m.Notify.Sends.Load(), m.Notify.Fallbacks.Load())
				}
			}
			if c.M.Notify.Recvs.Load() != 2 || cs.s.M.Notify.Recvs.Load() != 16 {
				t.Fatalf("received: client %d (event + drain), server %d", c.M.Notify.Recvs.Load(), cs.s.M.Notify.Recvs.Load())
			}
		})
	}
}

// TestNotifyByeEndsSession: the client's native goodbye ends the server's session (its
// active connections drop to 0) with no TCP byte, and no drain notice is sent back.
func TestNotifyByeEndsSession(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	nc := NotifyConfig{Enabled: true}
	cs := startCountingServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2, Notify: nc}, store.NewMem(1<<26))
	c, cc, sc := dialCounting(t, cs, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2, Notify: nc})
	cw, sw := cc.w.Load(), sc.w.Load()
	// Keep the client's TCP connection open past Close: only the native bye can end it.
	// Close still wakes the connection's reader (a read deadline), as closing would.
	c.boot = wakeOnlyConn{c.boot}
	defer cc.Close()
	c.Close()
	waitFor(t, "the session to end", func() bool { return cs.s.M.ActiveConns.Load() == 0 })
	if cc.w.Load() != cw || sc.w.Load() != sw {
		t.Fatal("bytes on the bootstrap connection")
	}
	if n := cs.s.M.Notify.Sends.Load(); n != 0 {
		t.Fatalf("server sent %d notifications to a client that left", n)
	}
	// The endpoint went back to the client's device idle list, not leaked.
	if c.M.Notify.Endpoints.Load() != 0 && c.M.DevicesOpen.Load() != 0 {
		t.Fatalf("endpoints %d with the device still open", c.M.Notify.Endpoints.Load())
	}
}

// TestNotifyFallbackOverTCP: a server without native notifications (a peer without
// support): the client's notifications and the server's drain notice go over the
// bootstrap connection when the fallback is on (counted, bytes seen), and fail with
// ErrUnsupported when it is off.
func TestNotifyFallbackOverTCP(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	srvRec := newRecorder()
	scfg := Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2,
		Notify: NotifyConfig{OOBFallback: true, Handler: srvRec.handle}} // not Enabled: no notification QP
	cs := startCountingServer(t, scfg, store.NewMem(1<<26))
	c, cc, sc := dialCounting(t, cs, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2,
		Notify: NotifyConfig{Enabled: true, OOBFallback: true}})
	if c.nep != nil {
		t.Fatal("native endpoint kept though the server has none")
	}
	if c.M.Notify.Endpoints.Load() != 1 { // released to the device's idle list
		t.Fatalf("%d endpoints open", c.M.Notify.Endpoints.Load())
	}
	cw := cc.w.Load()
	if err := c.Notify(context.Background(), "app.done", []byte("x")); err != nil {
		t.Fatal(err)
	}
	srvRec.wait(t, "app.done", 1)
	if cc.w.Load() == cw || c.M.Notify.Fallbacks.Load() != 1 {
		t.Fatalf("fallback not over TCP: %d bytes, %d fallbacks", cc.w.Load()-cw, c.M.Notify.Fallbacks.Load())
	}
	sw := sc.w.Load()
	cs.s.Close()
	waitFor(t, "the drain notice over TCP", c.Draining)
	if sc.w.Load() == sw || cs.s.M.Notify.Fallbacks.Load() != 1 {
		t.Fatalf("server drain: %d bytes, %d fallbacks", sc.w.Load()-sw, cs.s.M.Notify.Fallbacks.Load())
	}

	// Fallback off: the same peer is ErrUnsupported, nothing written.
	cs2 := startCountingServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2}, store.NewMem(1<<26))
	c2, cc2, _ := dialCounting(t, cs2, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2,
		Notify: NotifyConfig{Enabled: true}})
	w2 := cc2.w.Load()
	if err := c2.Notify(context.Background(), "app.done", nil); !errors.Is(err, notify.ErrUnsupported) {
		t.Fatalf("no fallback: %v", err)
	}
	if cc2.w.Load() != w2 {
		t.Fatal("bytes written without a fallback")
	}
}

// TestNotifyOversizedFallback: a notification larger than the server accepts natively goes
// over TCP (fallback on) or fails with ErrTooLarge (off); a fitting one stays native.
func TestNotifyOversizedFallback(t *testing.T) {
	for _, fallback := range []bool{true, false} {
		p := softProvider(t, soft.Options{Devices: 2})
		srvRec := newRecorder()
		scfg := Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2,
			Notify: NotifyConfig{Enabled: true, Endpoint: notify.Config{MaxMsg: 1024}, Handler: srvRec.handle}}
		cs := startCountingServer(t, scfg, store.NewMem(1<<26))
		c, cc, _ := dialCounting(t, cs, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2,
			Notify: NotifyConfig{Enabled: true, OOBFallback: fallback}})
		w := cc.w.Load()
		small, big := bytes.Repeat([]byte{1}, 1024-len("n")), bytes.Repeat([]byte{2}, 1024)
		if err := c.Notify(context.Background(), "n", small); err != nil {
			t.Fatal(err)
		}
		err := c.Notify(context.Background(), "n", big)
		if fallback {
			if err != nil {
				t.Fatal(err)
			}
			got := srvRec.wait(t, "n", 2)
			if !bytes.Equal(got[0], small) && !bytes.Equal(got[1], small) || !bytes.Equal(got[0], big) && !bytes.Equal(got[1], big) {
				t.Fatal("notifications differ")
			}
			if cc.w.Load() == w || c.M.Notify.Fallbacks.Load() != 1 || c.M.Notify.Sends.Load() != 1 {
				t.Fatalf("fallbacks %d native %d", c.M.Notify.Fallbacks.Load(), c.M.Notify.Sends.Load())
			}
		} else {
			if !errors.Is(err, notify.ErrTooLarge) {
				t.Fatalf("oversized without fallback: %v", err)
			}
			srvRec.wait(t, "n", 1)
			if cc.w.Load() != w {
				t.Fatal("bytes written without a fallback")
			}
		}
	}
}

// TestNotifyEndpointReusedAcrossConnections: connections that come and go on one shared
// device reuse its notification endpoints (registered buffers kept, new QP generation);
// all connections' notifications arrive; after the device goes, nothing is left.
func TestNotifyEndpointReusedAcrossConnections(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	srvRec := newRecorder()
	nc := NotifyConfig{Enabled: true}
	scfg := Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2, Notify: nc}
	scfg.Notify.Handler = srvRec.handle
	cs := startCountingServer(t, scfg, store.NewMem(1<<26))
	m := new(Metrics)
	dev, err := OpenDevice(p, "soft1", m)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c, _, _ := dialCounting(t, cs, Config{Provider: p, Shared: dev, MaxBlock: 1 << 20, Depth: 2, Notify: nc, Metrics: m})
		if err := c.Notify(context.Background(), "n", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		srvRec.wait(t, "n", i+1)
		c.Close()
		waitFor(t, "server session end", func() bool { return cs.s.M.ActiveConns.Load() == 0 })
	}
	if r := m.Notify.EndpointReuses.Load(); r != 4 {
		t.Fatalf("client endpoint reuses %d, want 4", r)
	}
	// The server's session ends when the client's QP goes away; an endpoint whose teardown
	// left flushed completions behind is not reused (TestClosedIDReused), so the server may
	// open a fresh one now and then. It must still reuse most of them.
	if r := cs.s.M.Notify.EndpointReuses.Load(); r < 3 || r > 4 {
		t.Fatalf("server endpoint reuses %d, want 3..4", r)
	}
	if m.Notify.Endpoints.Load() != 1 {
		t.Fatalf("client endpoints %d", m.Notify.Endpoints.Load())
	}
	dev.Release()
	if m.Notify.Endpoints.Load() != 0 || m.Notify.BufferBytes.Load() != 0 || m.Notify.CQEntries.Load() != 0 {
		t.Fatalf("left after release: %v", m.Notify.Snapshot())
	}
}

// TestNotifyRailEvent: a rail event reaches the clients of every rail natively (one on each
// of two rails), with the body naming the rail, its health and generation; the per-rail
// stats count one native send on each rail and no fallback.
func TestNotifyRailEvent(t *testing.T) {
	sp := softProvider(t, soft.Options{Devices: 2})
	r, _, err := NewRailServer(Config{Provider: sp, MaxBlock: 1 << 20, Depth: 2, SegmentBytes: 16 << 20,
		Notify: NotifyConfig{Enabled: true}}, store.NewMem(1<<26), []string{"soft0", "soft1"})
	if err != nil {
		t.Fatal(err)
	}
	addr := startRailServer(t, r)
	cp := softProvider(t, soft.Options{Devices: 2})
	var recs []*recorder
	for _, dev := range []string{"soft0", "soft1"} {
		rec := newRecorder()
		boot, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial(boot, Config{Provider: cp, Device: dev, MaxBlock: 1 << 20, Depth: 2,
			Notify: NotifyConfig{Enabled: true, Handler: rec.handle}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		recs = append(recs, rec)
	}
	waitFor(t, "both sessions tracked", func() bool {
		n := 0
		_, ss := r.served()
		for _, s := range ss {
			s.mu.Lock()
			n += len(s.notifiers)
			s.mu.Unlock()
		}
		return n == 2
	})
	sent, err := r.Broadcast(context.Background(), NotifyRail, RailEventBody("soft1", "RAIL_HEALTH_DOWN", 2))
	if err != nil || sent != 2 {
		t.Fatalf("broadcast: %d, %v", sent, err)
	}
	for _, rec := range recs {
		if b := rec.wait(t, NotifyRail, 1); string(b[0]) != "soft1 RAIL_HEALTH_DOWN 2" {
			t.Fatalf("rail event %q", b[0])
		}
	}
	for rail, st := range r.RailStats() {
		if st["dfkv_rdma_notify_sends_total"] != 1 || st["dfkv_rdma_notify_fallbacks_total"] != 0 {
			t.Fatalf("%s: sends %v fallbacks %v", rail, st["dfkv_rdma_notify_sends_total"], st["dfkv_rdma_notify_fallbacks_total"])
		}
	}
}

func TestParseRailEvent(t *testing.T) {
	d, h, g, err := ParseRailEvent(RailEventBody("mlx5_1", "Down", 7))
	if err != nil || d != "mlx5_1" || h != "Down" || g != 7 {
		t.Fatalf("round trip: %q %q %d %v", d, h, g, err)
	}
	for _, bad := range []string{"", "mlx5_1 Down", "mlx5_1 Down 7 x", "mlx5_1 Down -1", "mlx5_1 Down 4294967296", "a b c"} {
		if _, _, _, err := ParseRailEvent([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseRailEvent(f *testing.F) {
	f.Add(RailEventBody("soft1", "Healthy", 3))
	f.Add([]byte("x y 99999999999"))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, h, g, err := ParseRailEvent(body)
		if err != nil {
			return
		}
		if d2, h2, g2, err := ParseRailEvent(RailEventBody(d, h, g)); err != nil || d2 != d || h2 != h || g2 != g {
			t.Fatalf("%q: re-encoded parse %q %q %d %v", body, d2, h2, g2, err)
		}
	})
}

// wakeOnlyConn's Close ends pending reads (a deadline in the past) but leaves the TCP
// connection open.
type wakeOnlyConn struct{ net.Conn }

func (w wakeOnlyConn) Close() error { return w.Conn.SetReadDeadline(time.Now()) }
