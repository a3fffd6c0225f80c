package soft

import (
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// node is one side of a connection: a device context, PD, CQs and an RC QP.
type node struct {
	t        testing.TB
	ctx      verbs.Context
	pd       verbs.PD
	scq, rcq verbs.CQ
	qp       verbs.QP
	ep       verbs.Endpoint
}

type nodeCfg struct {
	sendWR, recvWR, cqDepth int
	signalAll               bool
}

func newNode(t testing.TB, p verbs.Provider, dev string, c nodeCfg) *node {
	t.Helper()
	if c.sendWR == 0 {
		c.sendWR = 64
	}
	if c.recvWR == 0 {
		c.recvWR = 64
	}
	if c.cqDepth == 0 {
		c.cqDepth = 256
	}
	ctx, err := p.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, ctx: ctx}
	if n.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if n.scq, err = ctx.CreateCQ(c.cqDepth); err != nil {
		t.Fatal(err)
	}
	if n.rcq, err = ctx.CreateCQ(c.cqDepth); err != nil {
		t.Fatal(err)
	}
	n.qp, err = n.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: n.scq, RecvCQ: n.rcq,
		MaxSendWR: c.sendWR, MaxRecvWR: c.recvWR, MaxSendSGE: 4, MaxRecvSGE: 4, SignalAll: c.signalAll})
	if err != nil {
		t.Fatal(err)
	}
	port := ctx.Info().Ports[0]
	n.ep = verbs.Endpoint{QPNum: n.qp.Num(), PSN: rand.Uint32() & psnMask, GID: port.GID, Port: port.Num, MTU: port.MTU}
	t.Cleanup(func() {
		n.qp.Close()
		n.scq.Close()
		n.rcq.Close()
		n.pd.Close()
		n.ctx.Close()
	})
	return n
}

const allRemote = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

func connectPair(t testing.TB, a, b *node) {
	t.Helper()
	if err := verbs.Connect(a.qp, 1, allRemote, a.ep, b.ep, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(b.qp, 1, allRemote, b.ep, a.ep, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
}

func pair(t testing.TB, opt Options, ca, cb nodeCfg) (*node, *node) {
	t.Helper()
	opt.Devices = 2
	p, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, p, "soft0", ca)
	b := newNode(t, p, "soft1", cb)
	connectPair(t, a, b)
	return a, b
}

func (n *node) reg(size int, access verbs.Access) verbs.MR {
	n.t.Helper()
	buf, err := verbs.AllocBuffer(size)
	if err != nil {
		n.t.Fatal(err)
	}
	m, err := n.pd.RegMR(buf.Bytes(), access)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { m.Close(); buf.Free() })
	return m
}

func (n *node) post(wrs ...verbs.SendWR) {
	n.t.Helper()
	if i, err := n.qp.PostSend(wrs); err != nil {
		n.t.Fatalf("post_send stopped at %d: %v", i, err)
	}
}

func (n *node) postRecv(wrs ...verbs.RecvWR) {
	n.t.Helper()
	if i, err := n.qp.PostRecv(wrs); err != nil {
		n.t.Fatalf("post_recv stopped at %d: %v", i, err)
	}
}

func poll(t testing.TB, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wc, err := verbs.PollOne(ctx, cq)
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	return wc
}

func expectWC(t testing.TB, cq verbs.CQ, id uint64, st verbs.WCStatus) verbs.WorkCompletion {
	t.Helper()
	wc := poll(t, cq)
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion %+v, want id %d status %s", wc, id, st)
	}
	return wc
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func TestDevices(t *testing.T) {
	p, err := New(Options{Devices: 3})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := p.Devices()
	if err != nil || len(devs) != 3 {
		t.Fatalf("%v %v", devs, err)
	}
	seen := map[verbs.GID]bool{}
	for i, d := range devs {
		port, ok := d.ActivePort()
		if d.Name != []string{"soft0", "soft1", "soft2"}[i] || !ok || port.PhysState != verbs.PhysLinkUp || port.GID.IsZero() || d.NUMANode != -1 {
			t.Fatalf("device %d: %+v", i, d)
		}
		if seen[port.GID] {
			t.Fatalf("duplicate GID %s", port.GID)
		}
		seen[port.GID] = true
	}
	if _, err := p.Open("mlx5_0"); !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("open unknown device: %v", err)
	}
}

func TestWriteReadSendImm(t *testing.T) {
	a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
	src := a.reg(1<<20, verbs.AccessLocalWrite)
	dst := b.reg(1<<20, allRemote)
	fill(src.Bytes(), 1)

	// WRITE with three SGEs into the middle of dst.
	sgl := []verbs.SGE{verbs.SGEOf(src, 0, 1000), verbs.SGEOf(src, 5000, 70000), verbs.SGEOf(src, 200000, 3)}
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl, RemoteAddr: dst.Addr() + 4096, RKey: dst.RKey()})
	wc := expectWC(t, a.scq, 1, verbs.StatusSuccess)
	if wc.Opcode != verbs.WCWrite {
		t.Fatalf("opcode %s", wc.Opcode)
	}
	want := append(append(append([]byte(nil), src.Bytes()[:1000]...), src.Bytes()[5000:75000]...), src.Bytes()[200000:200003]...)
	if got := dst.Bytes()[4096 : 4096+len(want)]; crc32.ChecksumIEEE(got) != crc32.ChecksumIEEE(want) {
		t.Fatal("WRITE placed wrong bytes")
	}

	// READ it back into two SGEs of a fresh local buffer.
	back := a.reg(1<<20, verbs.AccessLocalWrite)
	a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEOf(back, 0, 500), verbs.SGEOf(back, 1000, len(want)-500)}, RemoteAddr: dst.Addr() + 4096, RKey: dst.RKey()})
	wc = expectWC(t, a.scq, 2, verbs.StatusSuccess)
	if wc.Opcode != verbs.WCRead || wc.ByteLen != uint32(len(want)) {
		t.Fatalf("read completion %+v", wc)
	}
	got := append(append([]byte(nil), back.Bytes()[:500]...), back.Bytes()[1000:1000+len(want)-500]...)
	if crc32.ChecksumIEEE(got) != crc32.ChecksumIEEE(want) {
		t.Fatal("READ returned wrong bytes")
	}

	// WRITE_WITH_IMM consumes a receive (without scattering into it) and delivers the imm.
	rbuf := b.reg(4096, verbs.AccessLocalWrite)
	b.postRecv(verbs.RecvWR{ID: 77, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 4096)}})
	a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 4096)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey(), Imm: 0xfeedbeef})
	expectWC(t, a.scq, 3, verbs.StatusSuccess)
	rwc := expectWC(t, b.rcq, 77, verbs.StatusSuccess)
	if rwc.Opcode != verbs.WCRecvWithImm || !rwc.HasImm || rwc.Imm != 0xfeedbeef || rwc.ByteLen != 4096 || rwc.QPNum != b.qp.Num() {
		t.Fatalf("recv completion %+v", rwc)
	}
	if crc32.ChecksumIEEE(dst.Bytes()[:4096]) != crc32.ChecksumIEEE(src.Bytes()[:4096]) {
		t.Fatal("WRITE_WITH_IMM placed wrong bytes")
	}
	for _, c := range rbuf.Bytes() {
		if c != 0 {
			t.Fatal("WRITE_WITH_IMM scattered into the receive buffer")
		}
	}

	// SEND (with imm) scatters into the receive's SGEs.
	b.postRecv(verbs.RecvWR{ID: 78, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 100), verbs.SGEOf(rbuf, 200, 3000)}})
	a.post(verbs.SendWR{ID: 4, Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 10, 1500)}, Imm: 5})
	expectWC(t, a.scq, 4, verbs.StatusSuccess)
	rwc = expectWC(t, b.rcq, 78, verbs.StatusSuccess)
	if rwc.Opcode != verbs.WCRecv || rwc.ByteLen != 1500 || rwc.Imm != 5 || !rwc.HasImm {
		t.Fatalf("recv completion %+v", rwc)
	}
	gotSend := append(append([]byte(nil), rbuf.Bytes()[:100]...), rbuf.Bytes()[200:1600]...)
	if crc32.ChecksumIEEE(gotSend) != crc32.ChecksumIEEE(src.Bytes()[10:1510]) {
		t.Fatal("SEND scattered wrong bytes")
	}
}

// RC ordering: unsignaled WRITEs followed by a SEND; when the SEND's receive completes at the
// responder every earlier WRITE must be in place, and the requester sees only the SEND.
func TestOrderingWritesBeforeSend(t *testing.T) {
	a, b := pair(t, Options{}, nodeCfg{sendWR: 128}, nodeCfg{})
	src := a.reg(64*4096, verbs.AccessLocalWrite)
	dst := b.reg(64*4096, allRemote)
	rbuf := b.reg(64, verbs.AccessLocalWrite)
	fill(src.Bytes(), 2)
	for round := range 5 {
		b.postRecv(verbs.RecvWR{ID: uint64(round), SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
		var wrs []verbs.SendWR
		for i := range 64 {
			wrs = append(wrs, verbs.SendWR{ID: uint64(1000 + i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(src, i*4096, 4096)},
				RemoteAddr: dst.Addr() + uint64(i*4096), RKey: dst.RKey()})
		}
		wrs = append(wrs, verbs.SendWR{ID: 9, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}})
		a.post(wrs...)
		expectWC(t, b.rcq, uint64(round), verbs.StatusSuccess)
		if crc32.ChecksumIEEE(dst.Bytes()) != crc32.ChecksumIEEE(src.Bytes()) {
			t.Fatalf("round %d: SEND arrived before the WRITEs placed their bytes", round)
		}
		expectWC(t, a.scq, 9, verbs.StatusSuccess) // unsignaled WRITEs produce no completion
		fill(src.Bytes(), uint64(round+3))
	}
}

func TestRemoteAccessErrors(t *testing.T) {
	cases := []struct {
		name   string
		op     verbs.Opcode
		access verbs.Access
		rkey   func(m verbs.MR) uint32
		off    uint64
		n      int
	}{
		{"bad rkey", verbs.OpWrite, allRemote, func(m verbs.MR) uint32 { return m.RKey() ^ 0x5a5a00 }, 0, 16},
		{"past the end", verbs.OpWrite, allRemote, verbs.MR.RKey, 4096 - 8, 16},
		{"before the start", verbs.OpWrite, allRemote, verbs.MR.RKey, ^uint64(0) - 7, 16},
		{"no remote write", verbs.OpWrite, verbs.AccessLocalWrite | verbs.AccessRemoteRead, verbs.MR.RKey, 0, 16},
		{"no remote read", verbs.OpRead, verbs.AccessLocalWrite | verbs.AccessRemoteWrite, verbs.MR.RKey, 0, 16},
		{"imm with bad rkey", verbs.OpWriteWithImm, allRemote, func(m verbs.MR) uint32 { return m.RKey() + 0x100 }, 0, 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
			src := a.reg(4096, verbs.AccessLocalWrite)
			fill(src.Bytes(), 7)
			dst := b.reg(4096, tc.access)
			rbuf := b.reg(64, verbs.AccessLocalWrite)
			b.postRecv(verbs.RecvWR{ID: 50, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}}, verbs.RecvWR{ID: 51, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
			a.post(
				verbs.SendWR{ID: 1, Opcode: tc.op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, tc.n)},
					RemoteAddr: dst.Addr() + tc.off, RKey: tc.rkey(dst)},
				verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}},
			)
			expectWC(t, a.scq, 1, verbs.StatusRemAccessErr)
			expectWC(t, a.scq, 2, verbs.StatusWRFlushErr)
			if s := a.qp.State(); s != verbs.QPErr {
				t.Fatalf("requester qp %s after a remote access error", s)
			}
			// The responder tore its side down too: its receives flush, none was consumed.
			expectWC(t, b.rcq, 50, verbs.StatusWRFlushErr)
			expectWC(t, b.rcq, 51, verbs.StatusWRFlushErr)
			if s := b.qp.State(); s != verbs.QPErr {
				t.Fatalf("responder qp %s", s)
			}
			for _, c := range dst.Bytes() {
				if c != 0 {
					t.Fatal("a refused request changed target memory")
				}
			}
			// Posting to a QP in ERR completes flushed.
			a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}})
			expectWC(t, a.scq, 3, verbs.StatusWRFlushErr)
		})
	}
}

// A different PD's MR is invisible to a QP even with the right rkey.
func TestRemoteKeyFromOtherPD(t *testing.T) {
	a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
	src := a.reg(64, verbs.AccessLocalWrite)
	otherPD, err := b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	m, err := otherPD.RegMR(make([]byte, 64), allRemote)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 64)}, RemoteAddr: m.Addr(), RKey: m.RKey()})
	expectWC(t, a.scq, 1, verbs.StatusRemAccessErr)
}

// The QP's own access flags gate remote operations too.
func TestQPAccessFlags(t *testing.T) {
	p, err := New(Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, p, "soft0", nodeCfg{})
	b := newNode(t, p, "soft1", nodeCfg{})
	if err := verbs.Connect(a.qp, 1, allRemote, a.ep, b.ep, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(b.qp, 1, verbs.AccessLocalWrite|verbs.AccessRemoteRead, b.ep, a.ep, verbs.Path{}); err != nil {
		t.Fatal(err)
	}
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	expectWC(t, a.scq, 1, verbs.StatusRemAccessErr)
}

func TestLocalErrors(t *testing.T) {
	t.Run("local protection", func(t *testing.T) {
		a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
		src := a.reg(64, verbs.AccessLocalWrite)
		dst := b.reg(64, allRemote)
		sge := verbs.SGEOf(src, 0, 64)
		sge.LKey ^= 0x300
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{sge}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		expectWC(t, a.scq, 1, verbs.StatusLocProtErr)
	})
	t.Run("READ into memory without local write", func(t *testing.T) {
		a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
		ro := a.reg(64, 0)
		dst := b.reg(64, allRemote)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(ro, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		expectWC(t, a.scq, 1, verbs.StatusLocProtErr)
	})
	t.Run("receive too small", func(t *testing.T) {
		a, b := pair(t, Options{}, nodeCfg{}, nodeCfg{})
		src := a.reg(4096, verbs.AccessLocalWrite)
		rbuf := b.reg(64, verbs.AccessLocalWrite)
		b.postRecv(verbs.RecvWR{ID: 5, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 65)}})
		expectWC(t, b.rcq, 5, verbs.StatusLocLenErr)
		expectWC(t, a.scq, 1, verbs.StatusRemInvReqErr)
	})
	t.Run("receiver not ready", func(t *testing.T) {
		a, b := pair(t, Options{RNRTimeout: 50 * time.Millisecond}, nodeCfg{}, nodeCfg{})
		src := a.reg(64, verbs.AccessLocalWrite)
		dst := b.reg(64, allRemote)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Imm: 1})
		expectWC(t, a.scq, 1, verbs.StatusRNRRetryExcErr)
	})
}

func TestQueueLimitsAndStates(t *testing.T) {
	p, err := New(Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := newNode(t, p, "soft0", nodeCfg{sendWR: 4, recvWR: 2})
	b := newNode(t, p, "soft1", nodeCfg{})
	src := a.reg(64, verbs.AccessLocalWrite)
	wr := verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}}
	if _, err := a.qp.PostSend([]verbs.SendWR{wr}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("post_send in RESET: %v", err)
	}
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("post_recv in RESET: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPRTS}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("RESET -> RTS: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPInit, PortNum: 2}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("INIT on port 2: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPInit, PortNum: 1}); err != nil {
		t.Fatal(err)
	}
	// Receives may be posted from INIT on; the queue holds MaxRecvWR.
	if n, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {ID: 2}, {ID: 3}}); n != 2 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("post_recv past depth: n=%d err=%v", n, err)
	}
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 4, SGL: make([]verbs.SGE, 5)}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("too many recv SGEs: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPRTR}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("RTR without a remote: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPReset}); err != nil {
		t.Fatal(err)
	}
	connectPair(t, a, b)
	// The peer posts no receives: the SENDs stay outstanding (RNR wait), so the send queue
	// fills at MaxSendWR.
	wrs := []verbs.SendWR{wr, wr, wr, wr, wr}
	if n, err := a.qp.PostSend(wrs); n != 4 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("post_send past depth: n=%d err=%v", n, err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{Opcode: 9}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("bad opcode: %v", err)
	}
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPErr}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		expectWC(t, a.scq, 1, verbs.StatusWRFlushErr)
	}
}

func TestCQOverflow(t *testing.T) {
	a, b := pair(t, Options{}, nodeCfg{cqDepth: 2, signalAll: true}, nodeCfg{})
	src := a.reg(64, verbs.AccessLocalWrite)
	dst := b.reg(64, allRemote)
	for i := range 3 {
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	}
	// Nobody drains the CQ, so the third completion overflows it; an empty poll reports
	// the overflow without consuming anything.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := a.scq.Poll(nil)
		if errors.Is(err, verbs.ErrCQOverflow) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("a depth-2 CQ took three completions without overflowing")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCQWaitEndsOnContextAndClose(t *testing.T) {
	p, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := p.Open("soft0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	cq, err := ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := cq.Wait(c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cq.Wait(context.Background()) }()
	cq.Close()
	if err := <-done; !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
}

// Destroying the peer's QP (as a dying process does) fails what is in flight and flushes
// the rest; nothing hangs.
func TestPeerQPDestroyed(t *testing.T) {
	a, b := pair(t, Options{RNRTimeout: 5 * time.Second}, nodeCfg{}, nodeCfg{})
	src := a.reg(64, verbs.AccessLocalWrite)
	rbuf := a.reg(64, verbs.AccessLocalWrite)
	a.postRecv(verbs.RecvWR{ID: 40, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
	// No receive at b: the SEND waits in b's RNR timer while b dies.
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}},
		verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}})
	for {
		// Wait until the first request reached b (its stream is bound) before killing b.
		if bq := b.qp.(*qp); func() bool { bq.mu.Lock(); defer bq.mu.Unlock(); return bq.in != nil }() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.qp.Close()
	expectWC(t, a.scq, 1, verbs.StatusRetryExcErr)
	expectWC(t, a.scq, 2, verbs.StatusWRFlushErr)
	expectWC(t, a.rcq, 40, verbs.StatusWRFlushErr)
}

func TestAckDelayHoldsCompletion(t *testing.T) {
	release := make(chan struct{})
	a, b := pair(t, Options{AckDelay: func(op verbs.Opcode) time.Duration {
		if op == verbs.OpSend {
			<-release
		}
		return 0
	}}, nodeCfg{}, nodeCfg{})
	src := a.reg(64, verbs.AccessLocalWrite)
	rbuf := b.reg(64, verbs.AccessLocalWrite)
	b.postRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{verbs.SGEOf(rbuf, 0, 64)}})
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 8)}})
	expectWC(t, b.rcq, 1, verbs.StatusSuccess)
	var wcs [1]verbs.WorkCompletion
	if n, _ := a.scq.Poll(wcs[:]); n != 0 {
		t.Fatalf("SEND completed while its ACK was held: %+v", wcs[0])
	}
	close(release)
	expectWC(t, a.scq, 1, verbs.StatusSuccess)
}
