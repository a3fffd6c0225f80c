package onesided

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/ramtier"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func softProvider(t testing.TB, opt soft.Options) verbs.Provider {
	t.Helper()
	p, err := soft.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testServer runs a Server on a loopback TCP listener, serving each accepted connection.
type testServer struct {
	s    *Server
	ln   net.Listener
	errs chan error
}

func startServer(t testing.TB, cfg Config, eng store.Engine) *testServer {
	t.Helper()
	s, err := NewServer(cfg, eng)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{s: s, ln: ln, errs: make(chan error, 100)}
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
				ts.errs <- s.Serve(context.Background(), c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		s.Close()
	})
	return ts
}

func dial(t testing.TB, ts *testServer, cfg Config) (*Client, net.Conn) {
	t.Helper()
	boot, err := net.Dial("tcp", ts.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(boot, cfg)
	if err != nil {
		boot.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); boot.Close() })
	return c, boot
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func oid(i int) identity.ObjectID { return identity.ObjectID{Hi: 7, Lo: uint64(i)} }

func TestPutGetByteExact(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 64 << 20, Depth: 4, SegmentBytes: 300 << 20}, store.NewMem(1<<30))
	c, _ := dial(t, ts, Config{Provider: p, Device: "soft1", MaxBlock: 64 << 20, Depth: 2})
	ctx := context.Background()

	reg, err := verbs.AllocBuffer(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Free()
	if err := c.RegisterMemory(reg.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterMemory(reg.Bytes()); err != nil { // idempotent
		t.Fatalf("second registration: %v", err)
	}
	for i, n := range []int{1, 4095, 4096, 1<<20 + 3, 64 << 20} {
		v := randBytes(n, uint64(i))
		put := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(i), Value: [][]byte{v}}
		if err := c.Do(ctx, []*Op{put}); err != nil || put.Status != fb.StatusOk {
			t.Fatalf("put %d bytes: %v %s", n, err, put.Status)
		}
		dst := make([]byte, n)
		get := &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(i), Dst: [][]byte{dst}}
		if err := c.Do(ctx, []*Op{get}); err != nil || get.Status != fb.StatusOk || get.N != n || get.ValueLen != uint64(n) {
			t.Fatalf("get %d bytes: %v %+v", n, err, get)
		}
		if crc32.ChecksumIEEE(dst) != crc32.ChecksumIEEE(v) {
			t.Fatalf("get %d bytes: wrong bytes", n)
		}
		if n <= 8<<20 { // and through registered memory (zero copy both ways)
			src := reg.Bytes()[:n]
			copy(src, v)
			put := &Op{Kind: fb.OpPut, Tenant: 2, ID: oid(i), Value: [][]byte{src}}
			if err := c.Do(ctx, []*Op{put}); err != nil || put.Status != fb.StatusOk {
				t.Fatalf("registered put: %v %s", err, put.Status)
			}
			clear(reg.Bytes())
			get := &Op{Kind: fb.OpGet, Tenant: 2, ID: oid(i), Dst: [][]byte{reg.Bytes()[:n]}}
			if err := c.Do(ctx, []*Op{get}); err != nil || get.N != n || !bytes.Equal(reg.Bytes()[:n], v) {
				t.Fatalf("registered get %d bytes: %v %+v", n, err, get)
			}
		}
	}
	st := ts.s.Stats()
	if st["dfkv_rdma_v2_conns_opened_total"] != 1 || st["dfkv_rdma_v2_put_writes_total"] != 9 || st["dfkv_rdma_v2_get_writes_total"] != 9 || st["dfkv_rdma_completion_errors_total"] != 0 {
		t.Fatalf("server counters %v", st)
	}
}

func TestWindowSGRangeExist(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 8}, store.NewMem(1<<30))
	c, _ := dial(t, ts, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 8, MaxTargets: 4})
	ctx := context.Background()
	// A window of 40 PUTs (gathered from three pieces) then 40 GETs scattered into three
	// destinations, with ranges; replies strictly in order.
	var ops []*Op
	vals := map[int][]byte{}
	for i := range 40 {
		v := randBytes(1000+i*977, uint64(100+i))
		vals[i] = v
		a, b := len(v)/3, 2*len(v)/3
		ops = append(ops, &Op{Kind: fb.OpPut, ID: oid(i), Value: [][]byte{v[:a], v[a:b], v[b:]}})
	}
	if err := c.Do(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		if op.Status != fb.StatusOk {
			t.Fatalf("put %d: %s", i, op.Status)
		}
	}
	ops = ops[:0]
	for i := range 40 {
		n := len(vals[i])
		ops = append(ops, &Op{Kind: fb.OpGet, ID: oid(i), Dst: [][]byte{make([]byte, 100), make([]byte, 200), make([]byte, n)}},
			&Op{Kind: fb.OpGet, ID: oid(i), Offset: 17, Length: 500, Dst: [][]byte{make([]byte, 500)}},
			&Op{Kind: fb.OpExist, ID: oid(i)})
	}
	ops = append(ops, &Op{Kind: fb.OpExist, ID: oid(999)}, &Op{Kind: fb.OpGet, ID: oid(999), Dst: [][]byte{make([]byte, 10)}},
		&Op{Kind: fb.OpGet, ID: oid(0), Dst: [][]byte{make([]byte, 10)}}) // too small
	if err := c.Do(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		v := vals[i]
		whole, rng, ex := ops[3*i], ops[3*i+1], ops[3*i+2]
		got := append(append(append([]byte(nil), whole.Dst[0]...), whole.Dst[1]...), whole.Dst[2]...)[:len(v)]
		if whole.Status != fb.StatusOk || whole.N != len(v) || !bytes.Equal(got, v) {
			t.Fatalf("sg get %d: %s n=%d", i, whole.Status, whole.N)
		}
		if rng.Status != fb.StatusOk || rng.N != 500 || !bytes.Equal(rng.Dst[0], v[17:517]) {
			t.Fatalf("range get %d: %s n=%d", i, rng.Status, rng.N)
		}
		if ex.Status != fb.StatusOk || ex.ValueLen != uint64(len(v)) {
			t.Fatalf("exist %d: %+v", i, ex)
		}
	}
	tail := ops[120:]
	if tail[0].Status != fb.StatusNotFound || tail[1].Status != fb.StatusNotFound || tail[2].Status != fb.StatusBufferTooSmall {
		t.Fatalf("tail statuses %s %s %s", tail[0].Status, tail[1].Status, tail[2].Status)
	}
	rm := &Op{Kind: fb.OpRemove, ID: oid(3)}
	if err := c.Do(ctx, []*Op{rm}); err != nil || rm.Status != fb.StatusOk {
		t.Fatalf("remove: %v %s", err, rm.Status)
	}
}

func TestForcedV1ServerAndBadTails(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	ts := startServer(t, Config{Provider: p, Device: "soft0", ForceV1: true}, store.NewMem(1<<20))
	boot, err := net.Dial("tcp", ts.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close()
	if _, err := Dial(boot, Config{Provider: p, Device: "soft1"}); !errors.Is(err, dcp.ErrFallbackV1) {
		t.Fatalf("auto client against a forced-v1 server: %v", err)
	}

	ts2 := startServer(t, Config{Provider: p, Device: "soft0"}, store.NewMem(1<<20))
	for name, body := range map[string][]byte{
		"garbage":       []byte("not a flatbuffer at all"),
		"no rails":      dcp.Encode(dcp.Tail{Version: dcp.V2, MaxBlock: 4096, Depth: 2, MaxTargets: 1}),
		"block too big": dcp.Encode(dcp.Tail{Version: dcp.V2, MaxBlock: 1 << 40, Depth: 2, MaxTargets: 1, Rails: []dcp.Rail{{Device: "x", Port: 1, GID: verbs.GID{1}, QPNum: 5, MTU: 4096}}}),
	} {
		b, err := net.Dial("tcp", ts2.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if err := writeFrame(b, frameTail, body, time.Second); err != nil {
			t.Fatal(err)
		}
		kind, reason, err := readFrame(b, 5*time.Second)
		b.Close()
		if err != nil || kind != frameRefusal || len(reason) == 0 {
			t.Fatalf("%s: kind %d reason %q err %v", name, kind, reason, err)
		}
		t.Logf("%s refused: %s", name, reason)
	}
	// The server keeps serving everyone else.
	c, _ := dial(t, ts2, Config{Provider: p, Device: "soft1"})
	op := &Op{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{[]byte("still serving")}}
	if err := c.Do(context.Background(), []*Op{op}); err != nil || op.Status != fb.StatusOk {
		t.Fatalf("after refusals: %v %s", err, op.Status)
	}
	if got := ts2.s.Stats()["dfkv_rdma_refused_total"]; got != 3 {
		t.Fatalf("refused %v, want 3", got)
	}
}

// A GET target with a bad rkey: the server's WRITE fails with a remote access error, that
// connection is torn down (the client sees an error, never wrong bytes), and another
// connection is unaffected.
func TestBadTargetKeyTearsDownOneConnection(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	ts := startServer(t, Config{Provider: p, Device: "soft0"}, store.NewMem(1<<20))
	good, _ := dial(t, ts, Config{Provider: p, Device: "soft1"})
	bad, _ := dial(t, ts, Config{Provider: p, Device: "soft1"})
	ctx := context.Background()
	v := randBytes(5000, 9)
	put := &Op{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{v}}
	if err := good.Do(ctx, []*Op{put}); err != nil || put.Status != fb.StatusOk {
		t.Fatal(err, put.Status)
	}
	buf, _ := verbs.AllocBuffer(8192)
	defer buf.Free()
	if err := bad.RegisterMemory(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	testTargetRKeyXor = 0x5500
	get := &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{buf.Bytes()[:5000]}}
	err := bad.Do(ctx, []*Op{get})
	testTargetRKeyXor = 0
	if !errors.Is(err, ErrBroken) {
		t.Fatalf("GET with a bad rkey: %v (status %s)", err, get.Status)
	}
	if !bytes.Equal(buf.Bytes(), make([]byte, 8192)) {
		t.Fatal("bytes landed despite the bad rkey")
	}
	if err := bad.Do(ctx, []*Op{{Kind: fb.OpExist, ID: oid(1)}}); !errors.Is(err, ErrBroken) {
		t.Fatalf("broken connection reused: %v", err)
	}
	select {
	case err := <-ts.errs:
		if !errors.Is(err, ErrBroken) {
			t.Fatalf("server side: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server did not tear the connection down")
	}
	dst := make([]byte, 5000)
	g := &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{dst}}
	if err := good.Do(ctx, []*Op{g}); err != nil || !bytes.Equal(dst, v) {
		t.Fatalf("other connection: %v %s", err, g.Status)
	}
	if st := ts.s.Stats(); st["dfkv_rdma_completion_errors_total"] < 1 || st["dfkv_rdma_active_conns"] != 1 {
		t.Fatalf("server counters %v", st)
	}
}

// The client's responder holds the ACK of the server's reply SEND: the staging slot stays
// pinned, and the next request on that slot waits for the completion instead of
// overwriting bytes that may still be in flight.
func TestDelayedSendCompletionKeepsPin(t *testing.T) {
	hold := make(chan struct{}, 1)
	pc := softProvider(t, soft.Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend {
			select {
			case <-hold:
				return 300 * time.Millisecond
			default:
			}
		}
		return 0
	}})
	ps := softProvider(t, soft.Options{})
	ts := startServer(t, Config{Provider: ps, Depth: 1}, store.NewMem(1<<20))
	c, _ := dial(t, ts, Config{Provider: pc, Depth: 1})
	ctx := context.Background()
	a, b := randBytes(3000, 1), randBytes(3000, 2)
	if err := c.Do(ctx, []*Op{{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{a}}, {Kind: fb.OpPut, ID: oid(2), Value: [][]byte{b}}}); err != nil {
		t.Fatal(err)
	}
	hold <- struct{}{}
	da, db := make([]byte, 3000), make([]byte, 3000)
	ga := &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{da}}
	if err := c.Do(ctx, []*Op{ga}); err != nil {
		t.Fatal(err)
	}
	if got := ts.s.Stats()["dfkv_rdma_pins_held"]; got != 1 {
		t.Fatalf("pins held while the SEND's ACK is delayed: %v, want 1", got)
	}
	gb := &Op{Kind: fb.OpGet, ID: oid(2), Dst: [][]byte{db}}
	if err := c.Do(ctx, []*Op{gb}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(da, a) || !bytes.Equal(db, b) {
		t.Fatal("wrong bytes")
	}
	if got := ts.s.Stats()["dfkv_rdma_pin_waits_total"]; got < 1 {
		t.Fatalf("the second GET did not wait for the pinned slot (pin waits %v)", got)
	}
}

func TestNamedDeviceMissing(t *testing.T) {
	p := softProvider(t, soft.Options{})
	if _, err := NewServer(Config{Provider: p, Device: "mlx5_0"}, store.NewMem(1)); !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("named device missing: %v", err)
	}
}

func TestSegmentLeases(t *testing.T) {
	s := newSegment(10 * 4096)
	a, _ := s.alloc(3 * 4096)
	b, _ := s.alloc(3 * 4096)
	c, _ := s.alloc(4 * 4096)
	if _, err := s.alloc(1); err == nil {
		t.Fatal("allocated from a full segment")
	}
	s.release(b, 3*4096)
	if _, err := s.alloc(4 * 4096); err == nil {
		t.Fatal("4 pages from a 3-page hole")
	}
	s.release(a, 3*4096)
	if off, err := s.alloc(6 * 4096); err != nil || off != 0 {
		t.Fatalf("merged hole: off %d err %v", off, err)
	}
	s.release(0, 6*4096)
	s.release(c, 4*4096)
	if s.freeBytes() != 10*4096 || len(s.free) != 1 {
		t.Fatalf("free %d in %d extents", s.freeBytes(), len(s.free))
	}
}

// Warm GETs are written straight from the RAM tier's arena; the arena slot stays pinned
// until the reply's SEND completes (here held by an injected ACK delay), so neither an
// overwrite nor eviction can reuse it meanwhile.
func TestZeroCopyFromRAMTierKeepsPinUntilSendCompletes(t *testing.T) {
	tier, err := ramtier.New(store.NewMem(1<<30), ramtier.Config{ArenaBytes: 8 << 20, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var holding atomic.Bool
	pc := softProvider(t, soft.Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend && holding.Load() {
			<-release
		}
		return 0
	}})
	ts := startServer(t, Config{Provider: softProvider(t, soft.Options{}), Depth: 2}, tier)
	c, _ := dial(t, ts, Config{Provider: pc, Depth: 2})
	unhold := sync.OnceFunc(func() { holding.Store(false); close(release) })
	t.Cleanup(unhold) // runs before the connection closes, also when the test fails early
	ctx := context.Background()
	v := randBytes(300<<10, 3)
	if err := c.Do(ctx, []*Op{{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{v}}}); err != nil {
		t.Fatal(err)
	}
	holding.Store(true)
	dst := make([]byte, len(v))
	get := &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{dst}}
	if err := c.Do(ctx, []*Op{get}); err != nil || get.Status != fb.StatusOk || !bytes.Equal(dst, v) {
		t.Fatalf("zero-copy get: %v %s", err, get.Status)
	}
	if got := ts.s.Stats()["dfkv_rdma_v2_get_zero_copy_total"]; got != 1 {
		t.Fatalf("zero-copy gets %v, want 1", got)
	}
	if p := tier.RAMStats().Pinned; p != 1 {
		t.Fatalf("arena slots pinned while the SEND is unacknowledged: %d, want 1", p)
	}
	// Overwrite the key and churn the arena: the pinned slot must survive.
	w := randBytes(300<<10, 4)
	if err := store.PutFrom(tier, store.Key{ID: oid(1)}, append(w, make([]byte, 4096)...), len(w)); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := store.PutFrom(tier, store.Key{ID: oid(100 + i)}, make([]byte, 256<<10), 256<<10); err != nil {
			t.Fatal(err)
		}
	}
	if p := tier.RAMStats().Pinned; p != 1 {
		t.Fatalf("pin lost under churn: %d", p)
	}
	unhold()
	deadline := time.Now().Add(20 * time.Second)
	for tier.RAMStats().Pinned != 0 {
		// Watching a gauge, not standing in for an event: the server drops the pin as soon
		// as it polls the SEND completion, even with no further request.
		time.Sleep(time.Millisecond)
		if time.Now().After(deadline) {
			t.Fatalf("pin not released after the SEND completed: %d", tier.RAMStats().Pinned)
		}
	}
	get = &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{dst}}
	if err := c.Do(ctx, []*Op{get}); err != nil || !bytes.Equal(dst, w) {
		t.Fatalf("get after overwrite: %v %s", err, get.Status)
	}
}

// v1 (DCP1): SEND/RECV requests and replies, byte-exact, for a client forced to v1 and for
// an auto client that a forced-v1 server sends back to reconnect.
func TestV1SendRecv(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	for _, forced := range []bool{false, true} {
		ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 4 << 20, ForceV1: forced}, store.NewMem(1<<30))
		cfg := Config{Provider: p, Device: "soft1", MaxBlock: 2 << 20, Depth: 4, ForceV1: !forced}
		if forced {
			boot, err := net.Dial("tcp", ts.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Dial(boot, cfg); !errors.Is(err, dcp.ErrFallbackV1) {
				t.Fatalf("auto client against a forced-v1 server: %v", err)
			}
			cfg.ForceV1 = true // a fresh connection offering v1
		}
		c, _ := dial(t, ts, cfg)
		ctx := context.Background()
		reg, _ := verbs.AllocBuffer(1 << 20)
		defer reg.Free()
		if err := c.RegisterMemory(reg.Bytes()); err != nil {
			t.Fatal(err)
		}
		var ops []*Op
		vals := map[int][]byte{}
		for i, n := range []int{1, 4095, 4096, 100000, 1<<20 + 3, 2 << 20} {
			v := randBytes(n, uint64(200+i))
			vals[i] = v
			ops = append(ops, &Op{Kind: fb.OpPut, ID: oid(i), Value: [][]byte{v[:n/2], v[n/2:]}})
		}
		copy(reg.Bytes(), randBytes(1<<20, 9))
		ops = append(ops, &Op{Kind: fb.OpPut, ID: oid(50), Value: [][]byte{reg.Bytes()}}) // gathered from registered memory
		if err := c.Do(ctx, ops); err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if op.Status != fb.StatusOk {
				t.Fatalf("put %d: %s", i, op.Status)
			}
		}
		ops = ops[:0]
		for i := range vals {
			n := len(vals[i])
			ops = append(ops, &Op{Kind: fb.OpGet, ID: oid(i), Dst: [][]byte{make([]byte, n/3), make([]byte, n-n/3)}},
				&Op{Kind: fb.OpGet, ID: oid(i), Offset: uint64(n / 2), Length: uint64(n - n/2), Dst: [][]byte{make([]byte, n-n/2)}},
				&Op{Kind: fb.OpExist, ID: oid(i)})
		}
		small := &Op{Kind: fb.OpGet, ID: oid(3), Dst: [][]byte{make([]byte, 10)}}
		regGet := &Op{Kind: fb.OpGet, ID: oid(50), Dst: [][]byte{make([]byte, 1<<20)}}
		rm := &Op{Kind: fb.OpRemove, ID: oid(0)}
		miss := &Op{Kind: fb.OpGet, ID: oid(0), Dst: [][]byte{make([]byte, 1)}}
		ops = append(ops, small, regGet, rm, miss)
		if err := c.Do(ctx, ops); err != nil {
			t.Fatal(err)
		}
		for k := 0; k < len(vals); k++ {
			whole, rng, ex := ops[3*k], ops[3*k+1], ops[3*k+2]
			v := vals[int(whole.ID.Lo)]
			got := append(append([]byte(nil), whole.Dst[0]...), whole.Dst[1]...)
			if whole.Status != fb.StatusOk || whole.N != len(v) || !bytes.Equal(got, v) {
				t.Fatalf("v1 get %d bytes: %s n=%d", len(v), whole.Status, whole.N)
			}
			if rng.Status != fb.StatusOk || !bytes.Equal(rng.Dst[0], v[len(v)/2:]) {
				t.Fatalf("v1 range of %d bytes: %s", len(v), rng.Status)
			}
			if ex.Status != fb.StatusOk || ex.ValueLen != uint64(len(v)) {
				t.Fatalf("v1 exist: %+v", ex)
			}
		}
		if small.Status != fb.StatusBufferTooSmall || small.ValueLen != uint64(len(vals[3])) {
			t.Fatalf("v1 get into a short buffer: %s %d", small.Status, small.ValueLen)
		}
		if regGet.Status != fb.StatusOk || !bytes.Equal(regGet.Dst[0], reg.Bytes()) {
			t.Fatalf("v1 get of the registered value: %s", regGet.Status)
		}
		if rm.Status != fb.StatusOk || miss.Status != fb.StatusNotFound {
			t.Fatalf("v1 remove %s, get after %s", rm.Status, miss.Status)
		}
		st := ts.s.Stats()
		if st["dfkv_rdma_v1_conns_opened_total"] != 1 || st["dfkv_rdma_v2_conns_opened_total"] != 0 || st["dfkv_rdma_v1_puts_total"] != 7 {
			t.Fatalf("forced=%v: server counters %v", forced, st)
		}
	}
}
