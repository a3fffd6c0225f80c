package onesided

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Server serves v2 connections for one engine. The device context, PD and receive segment
// (registered once) are shared; QP, CQs and staging memory are per connection.
type Server struct {
	cfg    Config
	engine store.Engine
	ctx    verbs.Context
	port   verbs.PortInfo
	pd     verbs.PD
	segBuf *verbs.Buffer
	segMR  verbs.MR
	seg    *segment
	M      Metrics

	// The RAM tier's arena, registered once: warm GETs are written straight from it.
	pinner  store.Pinner
	arenaMR verbs.MR

	// Native notifications: the device's shared notification CQs (nil when disabled) and
	// the live connections' notification sides (Broadcast).
	hub       *notify.Hub
	notifiers map[*serverNotify]struct{}

	mu     sync.Mutex
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewServer opens the device and registers the receive segment.
func NewServer(cfg Config, engine store.Engine) (*Server, error) {
	cfg.defaults()
	ctx, port, err := pickDevice(cfg.Provider, cfg.Device)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, engine: engine, ctx: ctx, port: port, stop: make(chan struct{}), notifiers: map[*serverNotify]struct{}{}}
	if s.pd, err = ctx.AllocPD(); err != nil {
		ctx.Close()
		return nil, err
	}
	if cfg.shared != nil { // one of several rails: the segment is the rail server's
		s.segBuf, s.seg = cfg.shared.buf, cfg.shared.seg
	} else if s.segBuf, err = verbs.AllocBuffer(int(cfg.SegmentBytes)); err != nil {
		s.pd.Close()
		ctx.Close()
		return nil, err
	}
	if s.segMR, err = s.pd.RegMR(s.segBuf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		if cfg.shared == nil {
			s.segBuf.Free()
		}
		s.pd.Close()
		ctx.Close()
		return nil, fmt.Errorf("onesided: register receive segment of %d bytes: %w", cfg.SegmentBytes, err)
	}
	if s.seg == nil {
		s.seg = newSegment(cfg.SegmentBytes)
	}
	if cfg.Notify.Enabled {
		hc := cfg.Notify.Hub
		hc.Port, hc.Metrics, hc.Logger = port, &s.M.Notify, cfg.Logger
		s.hub = notify.NewHub(ctx, s.pd, hc)
	}
	// One device and PD serve every connection (QPs and CQs are per connection).
	s.M.DevicesOpen.Add(1)
	s.M.PDsOpen.Add(1)
	if p, ok := store.Find[store.Pinner](engine); ok && len(p.Arena()) > 0 {
		// Local read access is all a WRITE source needs. Registered once, not per connection.
		if mr, err := s.pd.RegMR(p.Arena(), 0); err == nil {
			s.pinner, s.arenaMR = p, mr
			s.M.MRPoolRegs.Add(1)
			s.M.MRPoolBytes.Add(int64(mr.Len()))
		} else {
			cfg.Logger.Warn("rdma: RAM tier arena not registered; GETs copy through staging", "err", err)
		}
	}
	return s, nil
}

// Stats returns the metrics plus the segment gauges.
func (s *Server) Stats() map[string]float64 {
	m := s.M.Snapshot()
	m["dfkv_rdma_recv_segment_bytes"] = float64(s.seg.size)
	m["dfkv_rdma_recv_segment_free_bytes"] = float64(s.seg.freeBytes())
	return m
}

// Close stops every connection (their CQ waits wake), joins them, and releases the device.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	s.wg.Wait()
	if s.hub != nil {
		s.hub.Close()
	}
	if s.arenaMR != nil {
		s.M.MRPoolBytes.Add(-int64(s.arenaMR.Len()))
		s.M.MRPoolDeregs.Add(1)
		s.arenaMR.Close()
	}
	s.segMR.Close()
	if s.cfg.shared == nil {
		s.segBuf.Free()
	}
	s.pd.Close()
	s.M.PDsOpen.Add(-1)
	s.M.DevicesOpen.Add(-1)
	return s.ctx.Close()
}

func (s *Server) refuse(boot net.Conn, err error) error {
	s.M.Refused.Add(1)
	writeFrame(boot, frameRefusal, []byte(err.Error()), s.cfg.IOTimeout)
	return err
}

// Serve runs the bootstrap on boot (a data connection past Hello) and then serves the RDMA
// connection until the client goes away, a completion fails, ctx ends or Close. A bad offer
// is refused on boot and returned; nothing else is affected.
func (s *Server) Serve(ctx context.Context, boot net.Conn) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("onesided: server closed")
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	kind, body, err := readFrame(boot, s.cfg.IOTimeout)
	if err != nil {
		return fmt.Errorf("onesided: read offer: %w", err)
	}
	return s.serveTail(ctx, boot, kind, body)
}

// serveTail is Serve past reading the first bootstrap frame. The caller holds s.wg.
func (s *Server) serveTail(ctx context.Context, boot net.Conn, kind byte, body []byte) error {
	cfg := s.cfg
	if kind != frameTail {
		return s.refuse(boot, fmt.Errorf("onesided: expected a tail, got frame %d", kind))
	}
	offer, err := dcp.DecodeOffer(body, cfg.limits())
	if err != nil {
		return s.refuse(boot, err)
	}
	if offer.MaxBlock > cfg.MaxBlock {
		return s.refuse(boot, fmt.Errorf("%w: max block %d above the server's %d", dcp.ErrRefused, offer.MaxBlock, cfg.MaxBlock))
	}
	if dcp.Protocol(offer, cfg.ForceV1) == dcp.V1 {
		if offer.Version == dcp.V2 {
			// Tell a v2 client to come back offering v1 on a fresh connection.
			ans := dcp.Tail{Version: dcp.V1, MaxBlock: offer.MaxBlock, Depth: min(offer.Depth, cfg.Depth),
				Rails: []dcp.Rail{s.rail(1, 0)}}
			writeFrame(boot, frameTail, dcp.Encode(ans), cfg.IOTimeout)
			return nil
		}
		return s.serveV1(ctx, boot, offer)
	}
	return s.serveV2(ctx, boot, offer)
}

// watch returns a context that ends when boot closes (the TCP connection is the RDMA
// connection's liveness signal), when ctx ends, or when the server stops (Close): the CQ
// waits of the connection's loop take it, so they wake. The returned stop wakes the boot
// reader and joins both watchers, so that a Serve that returned left no goroutine behind.
//
// The reader also takes notifications the client sent over TCP (the fallback), and a
// native dfkv.bye ends the session as a TCP close does.
func (s *Server) watch(ctx context.Context, boot net.Conn, sn *serverNotify) (context.Context, func()) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		readNotifyFrames(boot, sn.deliver(s.cfg.Notify.Handler))
		cancel()
	}()
	go func() {
		defer wg.Done()
		select {
		case <-s.stop:
			cancel()
		case <-sn.bye:
			cancel()
		case <-cctx.Done():
		}
	}()
	return cctx, func() {
		cancel()
		boot.SetReadDeadline(time.Now()) // wakes the reader; the session is over either way
		wg.Wait()
	}
}

func (s *Server) rail(qpn, psn uint32) dcp.Rail {
	return dcp.Rail{Device: s.ctx.Info().Name, Port: s.port.Num, LID: s.port.LID, GID: s.port.GID, QPNum: qpn, PSN: psn, MTU: s.port.MTU}
}

type serverConn struct {
	s        *Server
	depth    int
	slot     uint64
	block    uint64 // the client's declared max block
	targets  int
	leaseOff uint64
	seg      []byte                 // this connection's lease of the segment
	cq       verbs.CQ               // sends and receives: one wait wakes for either
	pending  []verbs.WorkCompletion // receive completions polled while looking for sends
	qp       verbs.QP
	stageBuf *verbs.Buffer // depth staging slots for GET values
	stage    verbs.MR
	respBuf  *verbs.Buffer // depth response prefixes
	resp     verbs.MR
	busy     []bool   // slot's SEND not yet completed: staging and response memory pinned
	release  []func() // slot's RAM tier pin, dropped on that SEND's completion
}

func (c *serverConn) close() {
	for _, x := range []interface{ Close() error }{c.qp, c.stage, c.resp, c.cq} {
		if x != nil {
			x.Close()
		}
	}
	if c.stageBuf != nil {
		c.stageBuf.Free()
	}
	if c.respBuf != nil {
		c.respBuf.Free()
	}
	if c.seg != nil {
		c.s.seg.release(c.leaseOff, uint64(len(c.seg)))
	}
	for _, b := range c.busy {
		if b {
			c.s.M.PinsHeld.Add(-1)
		}
	}
	for _, r := range c.release { // after the QP is gone: nothing reads the arena any more
		if r != nil {
			r()
		}
	}
}

func (s *Server) serveV2(ctx context.Context, boot net.Conn, offer dcp.Tail) (err error) {
	cfg := s.cfg
	c := &serverConn{s: s, depth: int(min(offer.Depth, cfg.Depth)), slot: dcp.SlotSize(offer.MaxBlock), block: offer.MaxBlock,
		targets: int(min(offer.MaxTargets, cfg.MaxTargets, maxTargetsInSlot))}
	if offer.DeviceTargets && !cfg.NoDeviceTargets {
		// A client that knows device targets takes up to a full header page of them
		// (dcp.DecodeAnswer): grant what this server is sized for.
		c.targets = int(min(cfg.MaxTargets, maxTargetsInSlot))
	}
	defer c.close()
	lease := uint64(c.depth) * c.slot
	if c.leaseOff, err = s.seg.alloc(lease); err != nil {
		return s.refuse(boot, fmt.Errorf("%s%w", busyPrefix, err))
	}
	c.seg = s.segBuf.Bytes()[c.leaseOff : c.leaseOff+lease]
	c.busy = make([]bool, c.depth)
	c.release = make([]func(), c.depth)
	sendWR := c.depth*(c.targets+1) + 1
	if c.cq, err = s.ctx.CreateCQ(sendWR + c.depth + 1); err != nil {
		return s.refuse(boot, err)
	}
	if c.qp, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: c.cq, RecvCQ: c.cq,
		MaxSendWR: sendWR, MaxRecvWR: c.depth, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return s.refuse(boot, err)
	}
	if c.stageBuf, err = verbs.AllocBuffer(int(lease)); err != nil {
		return s.refuse(boot, err)
	}
	if c.stage, err = s.pd.RegMR(c.stageBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return s.refuse(boot, err)
	}
	if c.respBuf, err = verbs.AllocBuffer(c.depth * wire.ResponseSize); err != nil {
		return s.refuse(boot, err)
	}
	if c.resp, err = s.pd.RegMR(c.respBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return s.refuse(boot, err)
	}
	gid, err := chooseGID(s.ctx, s.port, boot, cfg.GID, &offer.Rails[0])
	if err != nil {
		return s.refuse(boot, err)
	}
	path := gid.Path(cfg.GID)
	local := s.rail(c.qp.Num(), rand.Uint32()&0xffffff)
	local.GID, local.GIDType = gid.Entry.GID, gid.Entry.Type
	if err := verbs.Connect(c.qp, s.port.Num, verbs.AccessRemoteWrite|verbs.AccessLocalWrite, local.Endpoint(), offer.Rails[0].Endpoint(), path); err != nil {
		return s.refuse(boot, err)
	}
	recvs := make([]verbs.RecvWR, c.depth)
	for i := range recvs {
		recvs[i].ID = recvTag | uint64(i)
	}
	if _, err := c.qp.PostRecv(recvs); err != nil {
		return s.refuse(boot, err)
	}
	ans := dcp.Tail{Version: dcp.V2, MaxBlock: offer.MaxBlock, Depth: uint32(c.depth), MaxTargets: uint32(c.targets),
		Rails: []dcp.Rail{local},
		Segments: []dcp.Segment{{Addr: s.segMR.Addr() + c.leaseOff, RKey: s.segMR.RKey(), Length: lease,
			SlotBytes: c.slot, Slots: uint32(c.depth)}},
		// The server needs nothing of a device target beyond what any target gets (an RDMA
		// WRITE, never a reply payload): saying so tells the client this server knows the
		// contract (no inline replies, no bounce through the client's CPU).
		DeviceTargets: offer.DeviceTargets && !cfg.NoDeviceTargets}
	sn, err := s.acceptNotify(boot, offer, &ans, path)
	if err != nil {
		return s.refuse(boot, err)
	}
	if err := writeFrame(boot, frameTail, dcp.Encode(ans), cfg.IOTimeout); err != nil {
		sn.end(s, false)
		return fmt.Errorf("onesided: send answer: %w", err)
	}
	s.M.V2ConnsOpened.Add(1)
	s.M.ActiveConns.Add(1)
	defer s.M.ActiveConns.Add(-1)

	cctx, stop := s.watch(ctx, boot, sn)
	s.track(sn, true)
	err = c.loop(cctx)
	stop()
	s.track(sn, false)
	sn.end(s, s.gone(ctx))
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (c *serverConn) fail(format string, a ...any) error {
	return fmt.Errorf("%w: %w", ErrBroken, fmt.Errorf(format, a...))
}

// recvTag marks receive WR ids, so that completions are told apart even when flushed
// (a flushed completion's opcode is undefined on hardware).
const recvTag = 1 << 32

// poll drains the CQ: send completions are handled at once (a slot's pins drop on its
// SEND's signaled completion), receive completions are queued in order in c.pending.
func (c *serverConn) poll() error {
	var wcs [16]verbs.WorkCompletion
	for {
		n, err := c.cq.Poll(wcs[:])
		if err != nil {
			return c.fail("cq: %w", err)
		}
		for i, wc := range wcs[:n] {
			c.s.M.Completions.Add(1)
			if wc.Status != verbs.StatusSuccess {
				// Count the cause, not the flushes it brings along.
				countError(&c.s.M, wc)
				for _, w := range wcs[i+1 : n] {
					if w.Status != verbs.StatusSuccess {
						countError(&c.s.M, w)
					}
				}
				drainErrors(&c.s.M, c.cq)
				return c.fail("completion: %w", wc.Err())
			}
			if wc.ID&recvTag != 0 {
				c.pending = append(c.pending, wc)
				continue
			}
			if wc.Opcode != verbs.WCSend || wc.ID >= uint64(c.depth) || !c.busy[wc.ID] {
				return c.fail("unexpected send completion %+v", wc)
			}
			c.busy[wc.ID] = false
			c.s.M.PinsHeld.Add(-1)
			if r := c.release[wc.ID]; r != nil {
				c.release[wc.ID] = nil
				r()
			}
		}
		if n < len(wcs) {
			return nil
		}
	}
}

// nextRecv returns the next receive completion; send completions met on the way (also
// while idle) are handled, so pins never outlive their SEND by more than a wake-up.
func (c *serverConn) nextRecv(ctx context.Context) (verbs.WorkCompletion, error) {
	for {
		if len(c.pending) > 0 {
			wc := c.pending[0]
			c.pending = c.pending[1:]
			return wc, nil
		}
		if err := c.poll(); err != nil {
			return verbs.WorkCompletion{}, err
		}
		if len(c.pending) > 0 {
			continue
		}
		if err := c.cq.Wait(ctx); err != nil {
			return verbs.WorkCompletion{}, err
		}
	}
}

func (c *serverConn) loop(ctx context.Context) error {
	s := c.s
	next := 0
	for {
		wc, err := c.nextRecv(ctx)
		if err != nil {
			return err
		}
		// Fail closed on everything the completion claims.
		if wc.Opcode != verbs.WCRecvWithImm || !wc.HasImm || wc.Imm != uint32(next) || wc.ID != recvTag|uint64(next) {
			return c.fail("completion %+v, want RECV_RDMA_WITH_IMM imm %d", wc, next)
		}
		slot := next
		next = (next + 1) % c.depth
		b := c.seg[uint64(slot)*c.slot : uint64(slot+1)*c.slot]
		if wc.ByteLen < wire.RequestSize || wc.ByteLen > dcp.SlotPayloadOffset {
			return c.fail("request of %d bytes", wc.ByteLen)
		}
		req, err := wire.DecodeRequest(b[:wire.RequestSize])
		if err != nil {
			return c.fail("request prefix: %w", err)
		}
		want := uint32(wire.RequestSize)
		if req.Op == fb.OpGet || req.Op == fb.OpSgGet {
			want += req.Count * targetSize
		}
		if wc.ByteLen != want {
			return c.fail("%s request of %d bytes, want %d", req.Op, wc.ByteLen, want)
		}
		// The slot's previous SEND must have completed before its memory is reused.
		if c.busy[slot] {
			s.M.PinWaits.Add(1)
		}
		for c.busy[slot] {
			if err := c.poll(); err != nil {
				return err
			}
			if !c.busy[slot] {
				break
			}
			if err := c.cq.Wait(ctx); err != nil {
				return err
			}
		}
		if _, err := c.qp.PostRecv([]verbs.RecvWR{{ID: recvTag | uint64(slot)}}); err != nil {
			return c.fail("repost receive: %w", err)
		}
		wrs, resp := c.handle(req, slot, b)
		r := c.respBuf.Bytes()[slot*wire.ResponseSize : (slot+1)*wire.ResponseSize]
		resp.Encode(r)
		wrs = append(wrs, verbs.SendWR{ID: uint64(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEOf(c.resp, slot*wire.ResponseSize, wire.ResponseSize)}})
		c.busy[slot] = true
		s.M.PinsHeld.Add(1)
		if _, err := c.qp.PostSend(wrs); err != nil {
			return c.fail("post reply: %w", err)
		}
	}
}

// handle executes one request from its slot and returns the WRITEs that carry a GET's
// value (to be posted before the reply) and the reply prefix.
func (c *serverConn) handle(req wire.Request, slot int, b []byte) ([]verbs.SendWR, wire.Response) {
	s := c.s
	key := store.Key{ID: identity.ObjectID(req.ID), Tenant: req.Tenant}
	resp := wire.Response{Op: req.Op, Status: fb.StatusOk}
	switch req.Op {
	case fb.OpPut:
		n := req.PayloadLen
		if n == 0 || n > c.block {
			resp.Status = fb.StatusInvalid
			return nil, resp
		}
		s.M.V2PutWrites.Add(1)
		resp.Status = statusOf(store.PutFrom(s.engine, key, b[dcp.SlotPayloadOffset:], int(n)))
	case fb.OpGet, fb.OpSgGet:
		if req.Count == 0 || int(req.Count) > c.targets {
			resp.Status = fb.StatusInvalid
			return nil, resp
		}
		var capacity uint64
		tg := make([]target, req.Count)
		for i := range tg {
			tg[i] = getTarget(b[wire.RequestSize+i*targetSize:])
			capacity += uint64(tg[i].len)
		}
		// Source of the WRITEs: the RAM tier's arena slot itself when the value is warm
		// (pinned until the reply's SEND completes), else a staging slot filled by the
		// engine (from RAM or disk).
		srcMR, srcOff := c.stage, uint64(slot)*c.slot
		var n int
		if v, release, ok := c.pinned(key); ok {
			n = len(v)
			if uint64(n) > c.block {
				release()
				resp.Status, resp.ValueLen = fb.StatusInvalid, uint64(n) // larger than this connection's declared block
				return nil, resp
			}
			srcMR, srcOff = s.arenaMR, addrOf0(v)-s.arenaMR.Addr()
			c.release[slot] = release
			s.M.ZeroCopyGets.Add(1)
			s.M.MRPoolOps.Add(1)
		} else {
			s.M.StagedOps.Add(1)
			stage := c.stageBuf.Bytes()[uint64(slot)*c.slot : uint64(slot+1)*c.slot]
			var err error
			n, err = store.ReadInto(s.engine, key, stage)
			if err != nil {
				resp.Status, resp.ValueLen = statusOf(err), uint64(max(n, 0))
				if errors.Is(err, store.ErrBufferTooSmall) {
					resp.Status = fb.StatusInvalid // larger than this connection's declared block
				}
				return nil, resp
			}
		}
		resp.ValueLen = uint64(n)
		fail := func(st fb.Status) ([]verbs.SendWR, wire.Response) {
			if r := c.release[slot]; r != nil {
				c.release[slot] = nil
				r()
			}
			resp.Status = st
			return nil, resp
		}
		off, length := req.Offset, req.Length
		if off > uint64(n) || (length != 0 && length > uint64(n)-off) {
			return fail(fb.StatusInvalid)
		}
		if length == 0 {
			length = uint64(n) - off
		}
		if length > capacity {
			return fail(fb.StatusBufferTooSmall)
		}
		// Scatter [off, off+length) over the targets in order, one WRITE per target.
		var wrs []verbs.SendWR
		src := srcOff + off
		left := length
		for _, t := range tg {
			if left == 0 {
				break
			}
			k := min(uint64(t.len), left)
			wrs = append(wrs, verbs.SendWR{ID: uint64(slot), Opcode: verbs.OpWrite,
				SGL: []verbs.SGE{verbs.SGEOf(srcMR, int(src), int(k))}, RemoteAddr: t.addr, RKey: t.rkey})
			src += k
			left -= k
		}
		s.M.V2GetWrites.Add(int64(len(wrs)))
		resp.PayloadLen = length
		return wrs, resp
	case fb.OpExist:
		n, err := s.engine.Stat(key)
		resp.Status, resp.ValueLen = statusOf(err), uint64(max(n, 0))
	case fb.OpRemove:
		resp.Status = statusOf(s.engine.Remove(key))
	default:
		resp.Status = fb.StatusInvalid
	}
	return nil, resp
}

// pinned returns key's value pinned in the registered RAM tier arena, if it is warm.
func (c *serverConn) pinned(key store.Key) ([]byte, func(), bool) {
	if c.s.pinner == nil {
		return nil, nil, false
	}
	v, release, ok := c.s.pinner.PinValue(key)
	if ok && len(v) == 0 {
		release()
		return nil, nil, false
	}
	return v, release, ok
}

// countError counts a failed completion unless it is a flush: flushes are what a QP in ERR
// does with its queue (e.g. after the peer closed), not a cause of their own.
func countError(m *Metrics, wc verbs.WorkCompletion) {
	if wc.Status != verbs.StatusWRFlushErr {
		m.CompletionErrors.Add(1)
	}
}

// drainErrors counts the failed completions left on cq.
func drainErrors(m *Metrics, cq verbs.CQ) {
	var wcs [16]verbs.WorkCompletion
	for {
		n, err := cq.Poll(wcs[:])
		if err != nil || n == 0 {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.StatusSuccess {
				countError(m, wc)
			}
		}
	}
}

func statusOf(err error) fb.Status {
	switch {
	case err == nil:
		return fb.StatusOk
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrCorrupt):
		return fb.StatusNotFound
	case errors.Is(err, store.ErrCacheFull):
		return fb.StatusCacheFull
	case errors.Is(err, store.ErrQuotaExceeded):
		return fb.StatusQuotaExceeded
	case errors.Is(err, store.ErrTooLarge), errors.Is(err, store.ErrInvalid):
		return fb.StatusInvalid
	}
	return fb.StatusIOError
}
