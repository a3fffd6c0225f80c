package notify

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/testutil"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// side is one device context with its hub (one "process" end of a pair).
type side struct {
	ctx  verbs.Context
	pd   verbs.PD
	hub  *Hub
	rail dcp.Rail
}

func provider(t testing.TB, opt soft.Options) verbs.Provider {
	t.Helper()
	p, err := soft.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newSide(t testing.TB, p verbs.Provider, cfg HubConfig) *side {
	t.Helper()
	ctx, err := p.Open("soft0")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	port, _ := ctx.Info().ActivePort()
	cfg.Port = port
	s := &side{ctx: ctx, pd: pd, rail: dcp.Rail{Device: "soft0", Port: port.Num, LID: port.LID, GID: port.GID, MTU: port.MTU}}
	s.hub = NewHub(ctx, pd, cfg)
	t.Cleanup(func() {
		s.hub.Close()
		pd.Close()
		ctx.Close()
	})
	return s
}

// connect connects two acquired endpoints to each other.
func connect(t testing.TB, a, b *Endpoint, sa, sb *side) {
	t.Helper()
	ia, ib := a.Info(), b.Info()
	if err := a.Connect(ib, sb.rail, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Connect(ia, sa.rail, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
}

func acquire(t testing.TB, s *side, cfg Config) *Endpoint {
	t.Helper()
	e, err := s.hub.Acquire(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// inbox collects delivered notifications (copies: the body is only valid in the handler).
type inbox struct {
	mu   sync.Mutex
	msgs []msg
	ch   chan struct{}
}

type msg struct {
	name string
	body []byte
}

func newInbox() *inbox { return &inbox{ch: make(chan struct{}, 1<<16)} }

func (in *inbox) handler(name string, body []byte) {
	in.mu.Lock()
	in.msgs = append(in.msgs, msg{name, bytes.Clone(body)})
	in.mu.Unlock()
	in.ch <- struct{}{}
}

// wait waits for n deliveries in total (bounded).
func (in *inbox) wait(t testing.TB, n int) []msg {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		in.mu.Lock()
		got := len(in.msgs)
		in.mu.Unlock()
		if got >= n {
			in.mu.Lock()
			defer in.mu.Unlock()
			return append([]msg(nil), in.msgs...)
		}
		select {
		case <-in.ch:
		case <-deadline:
			t.Fatalf("%d of %d notifications delivered", got, n)
		}
	}
}

func (in *inbox) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.msgs)
}

// body makes a checkable body: sender, sequence, CRC of the filler.
func body(sender, seq, n int) []byte {
	b := make([]byte, max(n, 12))
	binary.LittleEndian.PutUint32(b, uint32(sender))
	binary.LittleEndian.PutUint32(b[4:], uint32(seq))
	for i := 12; i < len(b); i++ {
		b[i] = byte(sender*31 + seq*7 + i)
	}
	binary.LittleEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[12:]))
	return b
}

func check(t testing.TB, b []byte) (sender, seq int) {
	t.Helper()
	if len(b) < 12 || crc32.ChecksumIEEE(b[12:]) != binary.LittleEndian.Uint32(b[8:]) {
		t.Fatalf("corrupt body of %d bytes", len(b))
	}
	return int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:]))
}

// eventually polls cond (a state the poller reaches asynchronously), bounded.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, what, cond)
}

func TestCodec(t *testing.T) {
	for _, c := range []struct {
		name string
		body []byte
	}{{"a", nil}, {"dfkv.drain", []byte("x")}, {string(bytes.Repeat([]byte{'n'}, MaxName)), bytes.Repeat([]byte{7}, 1000)}} {
		f, err := AppendFrame(nil, c.name, c.body)
		if err != nil {
			t.Fatal(err)
		}
		name, b, err := DecodeFrame(f)
		if err != nil || name != c.name || !bytes.Equal(b, c.body) {
			t.Fatalf("%q: got %q %v %v", c.name, name, len(b), err)
		}
	}
	if _, err := AppendFrame(nil, "", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty name: %v", err)
	}
	if _, err := AppendFrame(nil, string(make([]byte, MaxName+1)), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("long name: %v", err)
	}
	good, _ := AppendFrame(nil, "ab", []byte("cd"))
	bad := map[string][]byte{
		"short":       good[:HeaderSize-1],
		"version":     append([]byte{1, 9}, good[2:]...),
		"reserved":    append(append([]byte{}, good[:6]...), append([]byte{1, 0}, good[8:]...)...),
		"kind":        append([]byte{7}, good[1:]...),
		"name beyond": good[:HeaderSize+1],
		"credit body": []byte{kindCredit, version, 0, 0, 1, 0, 0, 0, 1},
	}
	for name, b := range bad {
		if _, _, err := DecodeFrame(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
	var cr [HeaderSize]byte
	encode(cr[:], kindCredit, 5, "", nil)
	if _, _, err := DecodeFrame(cr[:]); !errors.Is(err, ErrMalformed) {
		t.Errorf("credit message as out-of-band frame: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := AppendFrame(nil, "dfkv.drain", []byte("body"))
	f.Add(good)
	var cr [HeaderSize]byte
	encode(cr[:], kindCredit, 3, "", nil)
	f.Add(cr[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, _, name, body, err := decode(b)
		if err != nil {
			return
		}
		if kind == kindMsg && (len(name) == 0 || HeaderSize+len(name)+len(body) != len(b)) {
			t.Fatalf("accepted %d-byte name, %d-byte body in %d bytes", len(name), len(body), len(b))
		}
		if kind == kindMsg {
			again, err := AppendFrame(nil, string(name), body)
			if err != nil {
				t.Fatal(err)
			}
			if n2, b2, err := DecodeFrame(again); err != nil || n2 != string(name) || !bytes.Equal(b2, body) {
				t.Fatalf("round trip: %v", err)
			}
		}
	})
}

func TestWRID(t *testing.T) {
	for _, c := range []struct {
		id   uint32
		gen  uint16
		recv bool
		idx  int
	}{{1, 0, false, 0}, {maxID, genMask, true, idxMask}, {12345, 77, true, 4099}} {
		id, gen, recv, idx := splitID(wrID(c.id, c.gen, c.recv, c.idx))
		if id != c.id || gen != c.gen || recv != c.recv || idx != c.idx {
			t.Fatalf("%+v -> %d %d %v %d", c, id, gen, recv, idx)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	p := provider(t, soft.Options{})
	s := newSide(t, p, HubConfig{})
	for name, c := range map[string]Config{
		"credits":    {Credits: dcp.MaxNotifyCredits + 1},
		"neg credit": {Credits: -1},
		"send depth": {SendDepth: 5000},
		"small msg":  {MaxMsg: MaxName},
		"large msg":  {MaxMsg: dcp.MaxNotifyMsg + 1},
	} {
		if _, err := s.hub.Acquire(c); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestSendReceive(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{})
	b := acquire(t, sb, Config{Handler: in.handler})
	if err := a.Send(context.Background(), "x", nil); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("send before connect: %v", err)
	}
	connect(t, a, b, sa, sb)
	if err := a.Connect(b.Info(), sb.rail, verbs.Path{}); err == nil {
		t.Fatal("second connect accepted")
	}
	sizes := []int{0, 1, 100, 4096, 65528 - 4}
	for i, n := range sizes {
		if err := a.Send(context.Background(), "done", body(1, i, n)); err != nil {
			t.Fatal(err)
		}
	}
	got := in.wait(t, len(sizes))
	for i, m := range got {
		if _, seq := check(t, m.body); seq != i || m.name != "done" || len(m.body) != max(sizes[i], 12) {
			t.Fatalf("message %d: %q seq %d len %d", i, m.name, seq, len(m.body))
		}
	}
	if err := a.Send(context.Background(), "done", make([]byte, 65528-3)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if s, r := sa.hub.M.Sends.Load(), sb.hub.M.Recvs.Load(); s != int64(len(sizes)) || r != int64(len(sizes)) {
		t.Fatalf("sends %d recvs %d", s, r)
	}
}

// TestConcurrentSends: many goroutines on both ends at once, few credits: every message
// arrives once, intact, in each sender's order; credits come back by credit messages.
func TestConcurrentSends(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	ia, ib := newInbox(), newInbox()
	cfg := Config{Credits: 4, SendDepth: 3}
	ca, cb := cfg, cfg
	ca.Handler, cb.Handler = ia.handler, ib.handler
	a, b := acquire(t, sa, ca), acquire(t, sb, cb)
	connect(t, a, b, sa, sb)
	const senders, per = 6, 150
	var wg sync.WaitGroup
	for g := range senders {
		for _, e := range []*Endpoint{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					if err := e.Send(context.Background(), "n", body(g, i, 64+i)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, in := range []*inbox{ia, ib} {
		next := make([]int, senders)
		for _, m := range in.wait(t, senders*per) {
			s, seq := check(t, m.body)
			if seq != next[s] {
				t.Fatalf("sender %d: seq %d, want %d", s, seq, next[s])
			}
			next[s]++
		}
	}
	if ia.count() != senders*per || ib.count() != senders*per {
		t.Fatalf("delivered %d / %d", ia.count(), ib.count())
	}
	if sa.hub.M.CreditMsgs.Load()+sb.hub.M.CreditMsgs.Load() == 0 {
		t.Fatal("no credit message with 4 credits and 900 messages each way")
	}
}

// TestOneWayCreditReturn: traffic in one direction only; credits come back only by credit
// messages, and the sender never stalls for good.
func TestOneWayCreditReturn(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{Credits: 1, SendDepth: 1, SendTimeout: 5 * time.Second})
	b := acquire(t, sb, Config{Credits: 1, Handler: in.handler})
	connect(t, a, b, sa, sb)
	for i := range 200 {
		if err := a.Send(context.Background(), "n", body(0, i, 20)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	in.wait(t, 200)
	if n := sb.hub.M.CreditMsgs.Load(); n < 199 {
		t.Fatalf("%d credit messages for 200 notifications at 1 credit", n)
	}
}

// TestBackpressure: a peer that does not take its notifications (its poller held) leaves
// no credit: the next Send waits, bounded, then fails with ErrBackpressure; a Send waiting
// when the peer resumes goes through.
func TestBackpressure(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{Credits: 4, SendDepth: 8, SendTimeout: 100 * time.Millisecond})
	b := acquire(t, sb, Config{Credits: 4, Handler: in.handler})
	connect(t, a, b, sa, sb)
	gate := make(chan struct{})
	sb.hub.gate.Store(&gate)
	for i := range 4 {
		if err := a.Send(context.Background(), "n", body(0, i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err := a.Send(context.Background(), "n", body(0, 4, 10))
	if !errors.Is(err, ErrBackpressure) {
		t.Fatalf("fifth send with 4 credits: %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("backpressure wait took %v", d)
	}
	if sa.hub.M.BackpressureTimeouts.Load() != 1 {
		t.Fatalf("timeouts %d", sa.hub.M.BackpressureTimeouts.Load())
	}
	// A waiting Send (longer bound) completes once the peer polls again.
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.mu.Lock()
		a.cfg.SendTimeout = 10 * time.Second
		a.mu.Unlock()
		done <- a.Send(ctx, "n", body(0, 4, 10))
	}()
	eventually(t, "a second backpressure wait", func() bool { return sa.hub.M.BackpressureWaits.Load() == 2 })
	select {
	case err := <-done:
		t.Fatalf("send returned while the peer was held: %v", err)
	default:
	}
	sb.hub.gate.Store(nil)
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("waiting send: %v", err)
	}
	in.wait(t, 5)
	// The timed-out notification was never sent: exactly 5 arrived.
	if n := in.count(); n != 5 {
		t.Fatalf("%d delivered", n)
	}
}

// TestSendBufferBackpressure: completions held (slow ACKs) leave no free send buffer: the
// bounded wait ends with ErrBackpressure though credits remain.
func TestSendBufferBackpressure(t *testing.T) {
	p := provider(t, soft.Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend {
			return 400 * time.Millisecond
		}
		return 0
	}})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	a := acquire(t, sa, Config{Credits: 16, SendDepth: 2, SendTimeout: 50 * time.Millisecond})
	b := acquire(t, sb, Config{Credits: 16})
	connect(t, a, b, sa, sb)
	for range 2 {
		if err := a.Send(context.Background(), "n", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send(context.Background(), "n", nil); !errors.Is(err, ErrBackpressure) {
		t.Fatalf("third send with 2 send buffers held: %v", err)
	}
	eventually(t, "held completions", func() bool { s, _ := a.InFlight(); return s == 0 })
	if err := a.Send(context.Background(), "n", nil); err != nil {
		t.Fatalf("after the completions: %v", err)
	}
}

// TestContextEndsWait: the caller's context bounds the wait too.
func TestContextEndsWait(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	a := acquire(t, sa, Config{Credits: 1, SendTimeout: time.Minute})
	b := acquire(t, sb, Config{Credits: 1})
	connect(t, a, b, sa, sb)
	gate := make(chan struct{})
	sb.hub.gate.Store(&gate)
	defer close(gate)
	if err := a.Send(context.Background(), "n", nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := a.Send(ctx, "n", nil); !errors.Is(err, ErrBackpressure) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
}

// TestCQGrowth: endpoints beyond the first CQ's entries get a second, larger CQ; all of them
// work at once.
func TestCQGrowth(t *testing.T) {
	p := provider(t, soft.Options{})
	cfg := Config{Credits: 4, SendDepth: 4} // 12 entries each
	sa, sb := newSide(t, p, HubConfig{InitialCQEntries: 40}), newSide(t, p, HubConfig{})
	var as []*Endpoint
	var ins []*inbox
	for range 6 {
		in := newInbox()
		c := cfg
		c.Handler = in.handler
		a, b := acquire(t, sa, cfg), acquire(t, sb, c)
		connect(t, a, b, sa, sb)
		as, ins = append(as, a), append(ins, in)
	}
	if n, entries := sa.hub.CQs(); n != 2 || entries != 40+80 {
		t.Fatalf("%d CQs with %d entries, want 2 with 120", n, entries)
	}
	if g := sa.hub.M.CQGrowths.Load(); g != 1 {
		t.Fatalf("growths %d", g)
	}
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				if err := a.Send(context.Background(), "n", body(i, j, 32)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, in := range ins {
		for j, m := range in.wait(t, 50) {
			if s, seq := check(t, m.body); s != i || seq != j {
				t.Fatalf("endpoint %d got sender %d seq %d at %d", i, s, seq, j)
			}
		}
	}
}

// TestCQCapacityFailure: no room for another endpoint's completions is ErrCapacity; a closed
// endpoint's entries are reusable.
func TestCQCapacityFailure(t *testing.T) {
	p := provider(t, soft.Options{})
	s := newSide(t, p, HubConfig{InitialCQEntries: 12, MaxCQEntries: 30})
	cfg := Config{Credits: 4, SendDepth: 4} // 12 entries
	a := acquire(t, s, cfg)
	acquire(t, s, cfg) // a second CQ of 18 (what is left under the cap)
	if _, err := s.hub.Acquire(cfg); !errors.Is(err, ErrCapacity) {
		t.Fatalf("third endpoint: %v", err)
	}
	if n := s.hub.M.CapacityFailures.Load(); n != 1 {
		t.Fatalf("capacity failures %d", n)
	}
	a.Close()
	if _, err := s.hub.Acquire(cfg); err != nil {
		t.Fatalf("after a close: %v", err)
	}
}

// TestBufferCapacityFailure: the registered-buffer budget is enforced.
func TestBufferCapacityFailure(t *testing.T) {
	p := provider(t, soft.Options{})
	cfg := Config{Credits: 4, SendDepth: 4, MaxMsg: 4096 - HeaderSize} // 12 x 4 KiB
	s := newSide(t, p, HubConfig{MaxBufferBytes: 2 * 12 * 4096})
	a := acquire(t, s, cfg)
	acquire(t, s, cfg)
	if _, err := s.hub.Acquire(cfg); !errors.Is(err, ErrCapacity) {
		t.Fatalf("third endpoint: %v", err)
	}
	if got := s.hub.M.BufferBytes.Load(); got != 2*12*4096 {
		t.Fatalf("buffer bytes %d", got)
	}
	a.Close()
	if got := s.hub.M.BufferBytes.Load(); got != 12*4096 {
		t.Fatalf("buffer bytes after close %d", got)
	}
	acquire(t, s, cfg)
}

// TestEndpointReuseAndRestart: a released endpoint comes back from the idle list with its
// buffers (no new registration), a new QP and generation; a restarted pair works again;
// nothing sent before a restart is delivered after it.
func TestEndpointReuseAndRestart(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{})
	b := acquire(t, sb, Config{Handler: in.handler})
	connect(t, a, b, sa, sb)
	if err := a.Send(context.Background(), "one", nil); err != nil {
		t.Fatal(err)
	}
	in.wait(t, 1)
	id, gen, qpn := a.ID(), a.Generation(), a.Info().QPNum
	bytesBefore := sa.hub.M.BufferBytes.Load()
	a.Release()
	if err := a.Send(context.Background(), "x", nil); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("send on a released endpoint: %v", err)
	}
	a2 := acquire(t, sa, Config{})
	if a2 != a || a2.ID() != id || a2.Generation() != gen+1 || a2.Info().QPNum == qpn {
		t.Fatalf("reuse: id %d gen %d qp %d (was %d %d %d)", a2.ID(), a2.Generation(), a2.Info().QPNum, id, gen, qpn)
	}
	if sa.hub.M.EndpointReuses.Load() != 1 || sa.hub.M.BufferBytes.Load() != bytesBefore {
		t.Fatalf("reuses %d, buffer bytes %d (was %d)", sa.hub.M.EndpointReuses.Load(), sa.hub.M.BufferBytes.Load(), bytesBefore)
	}
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	connect(t, a2, b, sa, sb)
	for round := range 4 {
		if err := a2.Send(context.Background(), "r", body(0, round, 10)); err != nil {
			t.Fatal(err)
		}
		in.wait(t, 2+round)
		if err := a2.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := b.Restart(); err != nil {
			t.Fatal(err)
		}
		connect(t, a2, b, sa, sb)
	}
	if a2.Generation() != gen+5 {
		t.Fatalf("generation %d after 4 restarts and a reuse, want %d", a2.Generation(), gen+5)
	}
	// A fresh endpoint of another shape is not taken from the idle list.
	a2.Release()
	c := acquire(t, sa, Config{Credits: 3})
	if c == a2 {
		t.Fatal("idle endpoint of another shape reused")
	}
	if n := in.count(); n != 5 {
		t.Fatalf("%d delivered, want 5", n)
	}
}

// TestStaleCompletionDropped: completions of an old generation still on the shared CQ when
// the endpoint moved on (restart) are dropped, and the new generation's own completion is
// the only one it sees.
func TestStaleCompletionDropped(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	cfg := Config{Credits: 4, TeardownTimeout: 50 * time.Millisecond}
	a := acquire(t, sa, cfg)
	bc := cfg
	bc.Handler = in.handler
	b := acquire(t, sb, bc)
	connect(t, a, b, sa, sb)
	gate := make(chan struct{})
	sa.hub.gate.Store(&gate)
	if err := a.Send(context.Background(), "old", nil); err != nil {
		t.Fatal(err)
	}
	in.wait(t, 1)
	// The old send's completion is on a's CQ (unpolled) before the restart.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		if err := sa.hub.cqs[0].cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		break
	}
	// Restart: the flushed receives of the old QP join it, unrouted (the poller is held).
	if err := a.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	connect(t, a, b, sa, sb)
	if err := a.Send(context.Background(), "new", nil); err != nil {
		t.Fatal(err)
	}
	in.wait(t, 2)
	if s, _ := a.InFlight(); s != 1 {
		t.Fatalf("in flight %d before the poller runs", s)
	}
	sa.hub.gate.Store(nil)
	close(gate)
	stale := int64(1 + cfg.Credits + reserve) // the old send + the old QP's flushed receives
	eventually(t, "stale completions dropped", func() bool { return sa.hub.M.Drops.Load() >= stale })
	eventually(t, "the new send's completion", func() bool { s, _ := a.InFlight(); return s == 0 })
	if d := sa.hub.M.Drops.Load(); d != stale {
		t.Fatalf("drops %d, want %d", d, stale)
	}
	if s, r := a.InFlight(); s != 0 || r != cfg.Credits+reserve {
		t.Fatalf("in flight %d sends, %d receives", s, r)
	}
	if err := a.Send(context.Background(), "after", nil); err != nil {
		t.Fatalf("new generation broken by stale completions: %v", err)
	}
	in.wait(t, 3)
}

// TestTeardownWithInFlightSends: closing an endpoint while sends are in flight (ACKs held)
// returns within the teardown bound, every Send returns, the hub gets its resources back,
// and the peer sees only intact notifications.
func TestTeardownWithInFlightSends(t *testing.T) {
	p := provider(t, soft.Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend {
			return 200 * time.Millisecond
		}
		return 0
	}})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{Credits: 8, SendDepth: 8, SendTimeout: 5 * time.Second, TeardownTimeout: time.Second})
	b := acquire(t, sb, Config{Credits: 8, Handler: in.handler})
	connect(t, a, b, sa, sb)
	var wg sync.WaitGroup
	var ok atomic.Int64
	errs := make(chan error, 1000)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				err := a.Send(context.Background(), "n", body(g, i, 100))
				if err != nil {
					errs <- err
					return
				}
				ok.Add(1)
			}
		}()
	}
	eventually(t, "sends in flight", func() bool { s, _ := a.InFlight(); return s >= 4 })
	start := time.Now()
	a.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("close took %v", d)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrBroken) {
			t.Fatalf("send during teardown: %v", err)
		}
	}
	if s, r := a.InFlight(); s != 0 || r != 0 {
		t.Fatalf("left in flight: %d sends, %d receives", s, r)
	}
	if sa.hub.M.Endpoints.Load() != 0 || sa.hub.M.BufferBytes.Load() != 0 {
		t.Fatalf("endpoints %d, buffer bytes %d", sa.hub.M.Endpoints.Load(), sa.hub.M.BufferBytes.Load())
	}
	for _, m := range in.wait(t, 0) {
		check(t, m.body)
	}
	if int64(in.count()) > ok.Load() {
		t.Fatalf("%d delivered, %d submitted", in.count(), ok.Load())
	}
	if err := a.Send(context.Background(), "n", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
}

// TestHubCloseWakesSenders: a Send waiting for credits returns at once when the hub closes.
func TestHubCloseWakesSenders(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	a := acquire(t, sa, Config{Credits: 1, SendTimeout: time.Minute, TeardownTimeout: 200 * time.Millisecond})
	b := acquire(t, sb, Config{Credits: 1})
	connect(t, a, b, sa, sb)
	gate := make(chan struct{})
	sb.hub.gate.Store(&gate)
	defer close(gate)
	if err := a.Send(context.Background(), "n", nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Send(context.Background(), "n", nil) }()
	eventually(t, "the wait", func() bool { return sa.hub.M.BackpressureWaits.Load() == 1 })
	sa.hub.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("send still waiting after the hub closed")
	}
	if _, err := sa.hub.Acquire(Config{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire on a closed hub: %v", err)
	}
}

// TestBrokenSendNotReplayed: a QP that fails after a send was submitted: that Send returned
// nil (local submission), the next one returns ErrBroken, and the Sender does not fall back
// to TCP for it (its fate is uncertain).
func TestBrokenSendNotReplayed(t *testing.T) {
	p := provider(t, soft.Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend {
			return 300 * time.Millisecond // the send stays in flight
		}
		return 0
	}})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	a, b := acquire(t, sa, Config{}), acquire(t, sb, Config{})
	connect(t, a, b, sa, sb)
	var fallbacks int
	s := &Sender{EP: a, AllowFallback: true, M: sa.hub.M, Fallback: func(string, []byte) error { fallbacks++; return nil }}
	if err := s.Send(context.Background(), "n", nil); err != nil {
		t.Fatalf("submission: %v", err)
	}
	if n, _ := a.InFlight(); n != 1 {
		t.Fatalf("%d sends in flight", n)
	}
	a.mu.Lock()
	a.qp.Modify(verbs.QPAttr{State: verbs.QPErr}) // the QP fails under the in-flight send
	a.mu.Unlock()
	eventually(t, "the uncertain send counted", func() bool { return sa.hub.M.SendErrors.Load() == 1 })
	if err := s.Send(context.Background(), "n", nil); !errors.Is(err, ErrBroken) {
		t.Fatalf("send on a broken endpoint: %v", err)
	}
	if fallbacks != 0 || sa.hub.M.Fallbacks.Load() != 0 || sa.hub.M.Sends.Load() != 1 {
		t.Fatalf("uncertain send replayed: %d fallbacks, %d native sends", fallbacks, sa.hub.M.Sends.Load())
	}
}

// TestFallback: the Sender's paths: a peer without notifications and an oversized message
// go over TCP only when allowed; backpressure never does.
func TestFallback(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{}), newSide(t, p, HubConfig{})
	in := newInbox()
	a := acquire(t, sa, Config{Credits: 1, SendTimeout: 50 * time.Millisecond})
	b := acquire(t, sb, Config{Credits: 1, MaxMsg: 1000, Handler: in.handler})
	connect(t, a, b, sa, sb)
	var oob []msg
	fb := func(name string, body []byte) error { oob = append(oob, msg{name, body}); return nil }
	m := new(Metrics)
	cases := []struct {
		name    string
		s       Sender
		size    int
		wantErr error
		wantOOB bool
	}{
		{"no peer support, no fallback", Sender{Fallback: fb, M: m}, 10, ErrUnsupported, false},
		{"no peer support, fallback", Sender{Fallback: fb, AllowFallback: true, M: m}, 10, nil, true},
		{"oversized, no fallback", Sender{EP: a, Fallback: fb, M: m}, 1001, ErrTooLarge, false},
		{"oversized, fallback", Sender{EP: a, Fallback: fb, AllowFallback: true, M: m}, 1001, nil, true},
		{"fits, native", Sender{EP: a, Fallback: fb, AllowFallback: true, M: m}, 1000 - 1, nil, false},
	}
	for _, c := range cases {
		n := len(oob)
		err := c.s.Send(context.Background(), "x", make([]byte, c.size))
		if (c.wantErr == nil) != (err == nil) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.wantErr)
		}
		if (len(oob) > n) != c.wantOOB {
			t.Fatalf("%s: out-of-band %v", c.name, len(oob) > n)
		}
	}
	if m.Fallbacks.Load() != 2 {
		t.Fatalf("fallbacks %d", m.Fallbacks.Load())
	}
	in.wait(t, 1)
	// Backpressure (the peer's poller held; one credit, used) is returned, not sent over TCP.
	gate := make(chan struct{})
	sb.hub.gate.Store(&gate)
	defer close(gate)
	s := Sender{EP: a, Fallback: fb, AllowFallback: true, M: m}
	var err error
	for range 3 {
		if err = s.Send(context.Background(), "x", nil); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrBackpressure) || m.Fallbacks.Load() != 2 {
		t.Fatalf("backpressure: %v, fallbacks %d", err, m.Fallbacks.Load())
	}
}

func TestMetricsNames(t *testing.T) {
	m := new(Metrics)
	for name := range m.Snapshot() {
		if len(name) < 17 || name[:17] != "dfkv_rdma_notify_" {
			t.Errorf("metric %s", name)
		}
	}
	if _, ok := m.Snapshot()["dfkv_rdma_notify_drops_total"]; !ok {
		t.Fatal("no drops series")
	}
}

// TestSharedCQOverflowBreaksEndpoints: if the shared CQ ever overflowed (here forced by
// undoing the reservation that prevents it), every endpoint on it fails with ErrBroken
// instead of hanging or taking wrong completions.
func TestSharedCQOverflowBreaksEndpoints(t *testing.T) {
	p := provider(t, soft.Options{})
	cfg := Config{Credits: 8, SendDepth: 1, TeardownTimeout: 100 * time.Millisecond} // 13 entries each
	sa, sb := newSide(t, p, HubConfig{InitialCQEntries: 13}), newSide(t, p, HubConfig{})
	a1 := acquire(t, sa, cfg)
	sa.hub.mu.Lock()
	sa.hub.cqs[0].reserved = 0 // the bug this test stands in for
	sa.hub.mu.Unlock()
	a2 := acquire(t, sa, cfg)
	if n, entries := sa.hub.CQs(); n != 1 || entries != 13 {
		t.Fatalf("%d CQs of %d entries", n, entries)
	}
	b1, b2 := acquire(t, sb, cfg), acquire(t, sb, cfg)
	connect(t, a1, b1, sa, sb)
	connect(t, a2, b2, sa, sb)
	gate := make(chan struct{})
	sa.hub.gate.Store(&gate)
	// 16 notifications into a1 and a2 (all their credits): 16 receive completions queued
	// behind the held poller on a CQ of 13.
	for range 8 {
		for _, b := range []*Endpoint{b1, b2} {
			if err := b.Send(context.Background(), "m", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	eventually(t, "the peers' sends acknowledged", func() bool {
		s1, _ := b1.InFlight()
		s2, _ := b2.InFlight()
		return s1 == 0 && s2 == 0
	})
	sa.hub.gate.Store(nil)
	close(gate)
	for _, a := range []*Endpoint{a1, a2} {
		eventually(t, "the endpoint broken", func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.state == stateBroken
		})
		if err := a.Send(context.Background(), "n", nil); !errors.Is(err, ErrBroken) {
			t.Fatalf("send after overflow: %v", err)
		}
	}
}

// TestClosedIDReused: a closed endpoint's id is reused in the generation after its last
// (ids do not run out under connection churn); an id whose teardown left completions
// behind is never reused.
func TestClosedIDReused(t *testing.T) {
	p := provider(t, soft.Options{})
	sa, sb := newSide(t, p, HubConfig{MaxIdle: -1}), newSide(t, p, HubConfig{})
	cfg := Config{TeardownTimeout: 50 * time.Millisecond}
	a := acquire(t, sa, cfg)
	id, gen := a.ID(), a.Generation()
	a.Close()
	a2 := acquire(t, sa, cfg)
	if a2 == a || a2.ID() != id || a2.Generation() != gen+1 {
		t.Fatalf("id %d gen %d, want %d %d", a2.ID(), a2.Generation(), id, gen+1)
	}
	b := acquire(t, sb, cfg)
	connect(t, a2, b, sa, sb)
	if err := a2.Send(context.Background(), "n", nil); err != nil {
		t.Fatal(err)
	}
	// The poller held: the teardown cannot drain, so this id stays out of reuse.
	gate := make(chan struct{})
	sa.hub.gate.Store(&gate)
	a2.Close()
	sa.hub.gate.Store(nil)
	close(gate)
	a3 := acquire(t, sa, cfg)
	if a3.ID() == id {
		t.Fatalf("id %d reused though its teardown left completions", id)
	}
	eventually(t, "the old completions dropped", func() bool { return sa.hub.M.Drops.Load() > 0 })
}
