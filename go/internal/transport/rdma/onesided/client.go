package onesided

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Op is one request of a window. Inputs: Kind (OpPut, OpGet, OpExist, OpRemove), Tenant,
// ID; Value (PUT, gathered in order into one stored value); Offset/Length (GET range,
// Length 0 = to the end) and Dst (GET, scattered in order). Outputs: Status, ValueLen
// (stored length for GET/EXIST) and N (bytes placed in Dst).
type Op struct {
	Kind           wire.Op
	Tenant         uint64
	ID             identity.ObjectID
	Value          [][]byte
	Offset, Length uint64
	Dst            [][]byte

	// Direct: Dst lies in device memory (Device.RegisterDMABuf). It is served only by the
	// server writing every piece into a registered range: never a staging slot or a
	// transient MR; Refused (wrapping ErrDirectRefused) says why it was not posted.
	Direct  bool
	Refused error

	Status   wire.Status
	ValueLen uint64
	N        int
	// Posted: the WR that makes the server act on this op (a v2 request's WRITE_WITH_IMM,
	// a v1 SEND) was handed to the QP. An op left Unavailable with Posted false is known
	// not to have reached the server (docs/RDMA.md, "Replay contract"); with Posted true it
	// may have run.
	Posted bool
}

// Client is one v2 RDMA connection. Not safe for concurrent use: one owner drives its
// window (as a dfkv pooled connection is).
type Client struct {
	cfg      Config
	boot     net.Conn // the TCP connection: the server ends the RDMA connection when it closes
	dev      *Device  // shared (Config.Shared) or this connection's own
	ctx      verbs.Context
	pd       verbs.PD
	scq, rcq verbs.CQ
	qp       verbs.QP
	tail     dcp.Tail
	seg      dcp.Segment
	depth    int
	hdrBuf   *verbs.Buffer // depth pages: request prefix + targets
	hdr      verbs.MR
	stageBuf *verbs.Buffer // depth slots: PUT payloads / GET bounce for unregistered memory
	stage    verbs.MR
	respBuf  *verbs.Buffer
	resp     verbs.MR
	M        *Metrics
	active   bool
	path     verbs.Path // source GID index, hop limit, traffic class (chooseGID)
	gen      uint32     // this QP's generation: the high half of every wr_id it posts (fencing)
	staleN   atomic.Int64
	v1       bool   // DCP1: requests and replies by SEND/RECV
	slotB    uint64 // slot bytes (v2: the lease's; v1: the receive buffers')
	respB    int    // bytes per reply buffer (v2: a prefix; v1: a slot)

	closeOnce sync.Once
	closeErr  error
	qpOnce    sync.Once // destroyQP

	// Notifications (notify.go).
	nep        *notify.Endpoint
	oob        *oob
	notifier   *notify.Sender
	readerDone chan struct{}
	draining   atomic.Bool
	peerClosed atomic.Bool // the bootstrap connection ended (the reader saw EOF or an error)

	portChecked time.Time // the last port state query (under mu)

	mu     sync.Mutex
	mrs    mrCache // transient MRs for unregistered caller memory
	broken error
	next   int
	sqMax  int   // send queue capacity
	sqUsed int   // send WRs posted and not yet reclaimed
	sqFIFO []int // WRs of each posted request, in order; reclaimed with its signaled completion
}

// Dial bootstraps a v2 connection over boot (a data connection past Hello) and owns boot
// from then on: it stays open as the liveness signal and Close closes it. On error boot is
// closed too. A server that answers v1 yields dcp.ErrFallbackV1 (open a fresh connection
// offering v1); a refusal yields ErrRefused with the server's reason.
func Dial(boot net.Conn, cfg Config) (_ *Client, err error) {
	cfg.defaults()
	c := &Client{cfg: cfg, depth: int(cfg.Depth), boot: boot, M: cfg.Metrics, gen: nextGen()}
	if c.M == nil {
		c.M = new(Metrics)
	}
	c.mrs = mrCache{limit: cfg.MRCacheBytes, m: c.M}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if cfg.Shared != nil {
		if !cfg.Shared.acquireRef() {
			return nil, fmt.Errorf("onesided: dial on a released device: %w", verbs.ErrClosed)
		}
		c.dev = cfg.Shared
	} else if c.dev, err = OpenDevice(cfg.Provider, cfg.Device, c.M); err != nil {
		return nil, err
	}
	c.ctx, c.pd = c.dev.ctx, c.dev.pd
	port := c.dev.port
	if c.scq, err = c.ctx.CreateCQ(4*c.depth + 4); err != nil {
		return nil, err
	}
	if c.rcq, err = c.ctx.CreateCQ(c.depth + 1); err != nil {
		return nil, err
	}
	maxSGE := min(max(c.ctx.Info().MaxSGE, 1), 16)
	c.sqMax = 2*c.depth + 2
	if c.qp, err = c.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: c.scq, RecvCQ: c.rcq,
		MaxSendWR: c.sqMax, MaxRecvWR: c.depth, MaxSendSGE: maxSGE, MaxRecvSGE: 1}); err != nil {
		return nil, err
	}
	gid, err := chooseGID(c.ctx, port, boot, cfg.GID, nil)
	if err != nil {
		return nil, err
	}
	c.path = gid.Path(cfg.GID)
	cfg.Logger.Debug("rdma: source GID", "device", c.ctx.Info().Name, "index", gid.Entry.Index, "gid", gid.Entry.GID, "type", gid.Entry.Type, "why", gid.Why)
	local := dcp.Rail{Device: c.ctx.Info().Name, Port: port.Num, LID: port.LID, GID: gid.Entry.GID, GIDType: gid.Entry.Type,
		QPNum: c.qp.Num(), PSN: rand.Uint32() & 0xffffff, MTU: port.MTU}
	offer := dcp.Tail{Version: dcp.V2, MaxBlock: cfg.MaxBlock, Depth: cfg.Depth, MaxTargets: min(cfg.MaxTargets, maxTargetsInSlot), Rails: []dcp.Rail{local},
		DeviceTargets: true}
	if cfg.ForceV1 {
		offer = dcp.Tail{Version: dcp.V1, MaxBlock: cfg.MaxBlock, Depth: cfg.Depth, Rails: []dcp.Rail{local}}
	}
	c.offerNotify(&offer)
	if err := writeFrame(boot, frameTail, dcp.Encode(offer), cfg.IOTimeout); err != nil {
		return nil, fmt.Errorf("onesided: send offer: %w", err)
	}
	kind, body, err := readFrame(boot, cfg.IOTimeout)
	if err != nil {
		return nil, fmt.Errorf("onesided: read answer: %w", err)
	}
	if kind == frameRefusal {
		if strings.HasPrefix(string(body), busyPrefix) {
			return nil, fmt.Errorf("%w: %w: %s", ErrRefused, ErrBusy, body)
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, body)
	}
	lim := cfg.limits()
	lim.MaxTargets = maxTargetsInSlot // what a device-target server may grant: the header page holds it
	ans, err := dcp.DecodeAnswer(body, offer, lim)
	if err != nil {
		return nil, err
	}
	c.tail, c.depth, c.v1 = ans, int(ans.Depth), ans.Version == dcp.V1
	if c.v1 {
		c.slotB, c.respB = dcp.SlotSize(ans.MaxBlock), int(dcp.SlotSize(ans.MaxBlock))
	} else {
		c.seg = ans.Segments[0]
		c.slotB, c.respB = c.seg.SlotBytes, wire.ResponseSize
	}
	if c.hdrBuf, err = verbs.AllocBuffer(c.depth * dcp.SlotPayloadOffset); err != nil {
		return nil, err
	}
	if c.hdr, err = c.pd.RegMR(c.hdrBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.stageBuf, err = verbs.AllocBuffer(c.depth * int(c.slotB)); err != nil {
		return nil, err
	}
	if c.stage, err = c.pd.RegMR(c.stageBuf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if c.respBuf, err = verbs.AllocBuffer(c.depth * c.respB); err != nil {
		return nil, err
	}
	if c.resp, err = c.pd.RegMR(c.respBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	recvs := make([]verbs.RecvWR, c.depth)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: c.wrID(i), SGL: []verbs.SGE{verbs.SGEOf(c.resp, i*c.respB, c.respB)}}
	}
	if err := verbs.Connect(c.qp, port.Num, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, local.Endpoint(), ans.Rails[0].Endpoint(), c.path); err != nil {
		return nil, err
	}
	if _, err := c.qp.PostRecv(recvs); err != nil {
		return nil, err
	}
	if err := c.answerNotify(ans); err != nil {
		return nil, err
	}
	if c.v1 {
		c.M.V1ConnsOpened.Add(1)
	} else {
		c.M.V2ConnsOpened.Add(1)
	}
	c.M.ActiveConns.Add(1)
	c.active = true
	return c, nil
}

// Close ends the connection: the TCP connection first (the server's signal that this end
// is going away), then the verbs objects, then its reference on the device (the last one
// deregisters the pools and frees the PD and context). A second Close does nothing.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Client) close() error {
	if c.active {
		c.active = false
		c.M.ActiveConns.Add(-1)
	}
	c.closeNotify()
	if c.boot != nil {
		c.boot.Close()
	}
	if c.readerDone != nil {
		<-c.readerDone
	}
	c.destroyQP()
	for _, x := range []interface{ Close() error }{c.hdr, c.stage, c.resp} {
		if x != nil {
			x.Close()
		}
	}
	c.mu.Lock()
	c.mrs.close()
	c.mu.Unlock()
	for _, b := range []*verbs.Buffer{c.hdrBuf, c.stageBuf, c.respBuf} {
		if b != nil {
			b.Free()
		}
	}
	for _, x := range []verbs.CQ{c.scq, c.rcq} {
		if x != nil {
			x.Close()
		}
	}
	if c.dev != nil {
		return c.dev.Release()
	}
	return nil
}

// Device is the device this connection runs on.
func (c *Client) Device() *Device { return c.dev }

// RegisterMemory registers buf on this connection's device (for every connection on it)
// for zero-copy PUT sources and GET targets. Registering the same range again is a no-op.
func (c *Client) RegisterMemory(buf []byte) error { return c.dev.RegisterMemory(buf) }

// testTargetRKeyXor corrupts advertised GET target keys (tests of remote access errors).
var testTargetRKeyXor uint32

type pending struct {
	op      *Op
	slot    int
	bounce  bool // GET landed in the staging slot; copy out
	capSize uint64
	tmp     []*mrEntry // transient MRs the op uses, released when it completes
	pools   []*poolMR  // pool MRs the op uses (UnregisterMemory waits for them)
	posted  time.Time  // a direct GET's post (DirectNanos)
}

// done releases p's transient and pool MRs (its op completed, or the connection broke).
func (c *Client) done(p *pending) {
	for _, e := range p.tmp {
		c.mrs.release(e)
	}
	p.tmp = nil
	for _, m := range p.pools {
		c.dev.releasePool(m)
	}
	p.pools = nil
}

// Do runs ops with up to depth requests in flight; replies complete strictly in order. A
// returned error wrapping ErrBroken means the connection is unusable; ops without a Status
// set were not completed.
func (c *Client) Do(ctx context.Context, ops []*Op) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	// Until its reply arrives an op reads Unavailable, never a zero-value Ok.
	for _, op := range ops {
		op.Status, op.ValueLen, op.N, op.Posted = fb.StatusUnavailable, 0, 0, false
	}
	// sgIn: the multi-SGE requests of window (in flight on this QP; SGMetrics).
	var sgIn int64
	var window []pending
	defer func() { // a broken connection: what was in flight lets go of its MRs
		if len(window) > 0 {
			// The server may still write into these targets (a timeout, a lost reply): no
			// write can land once the QP is destroyed, so only then may UnregisterMemory or
			// UnregisterDMABuf (which wait for these references) return and the memory go.
			c.destroyQP()
		}
		for i := range window {
			if window[i].op.Direct {
				c.M.DirectFailures.Add(1)
			}
			c.done(&window[i])
		}
	}()
	for i := 0; i < len(ops) || len(window) > 0; {
		if i < len(ops) && len(window) < c.depth {
			// A dead server or a down port ends the window before the next post: what is
			// not posted yet may run elsewhere (PUTs included).
			if c.peerClosed.Load() {
				return c.breakLocked(ErrPeerClosed)
			}
			if time.Since(c.portChecked) >= portCheckEvery {
				if err := c.portDown(); err != nil {
					return c.breakLocked(err)
				}
			}
			p, err := c.post(ctx, ops[i])
			if err != nil {
				c.done(&p)
				if errors.Is(err, ErrBroken) {
					return c.breakLocked(err)
				}
				if errors.Is(err, ErrDirectRefused) {
					c.M.DirectRefused.Add(1)
					ops[i].Refused = err
				}
				ops[i].Status = fb.StatusInvalid
				i++
				continue
			}
			window = append(window, p)
			if p.op.MultiSGE() {
				if sgIn > 0 {
					c.M.SG.Overlaps.Add(1)
				}
				sgIn++
				c.M.SG.Ops.Add(1)
				c.M.SG.raise(sgIn)
			}
			i++
			continue
		}
		if err := c.complete(ctx, window[0]); err != nil {
			return c.breakLocked(err)
		}
		if window[0].op.MultiSGE() {
			sgIn--
		}
		c.done(&window[0])
		window = window[1:]
	}
	return nil
}

// portDown returns an error wrapping verbs.ErrPortDown (counted) when the connection's port
// is not ACTIVE; nil when it is, or when the provider cannot say (the I/O timeout still
// bounds every wait). Called under mu.
func (c *Client) portDown() error {
	ps, ok := c.ctx.(verbs.PortStater)
	if !ok {
		return nil
	}
	c.portChecked = time.Now()
	st, err := ps.PortState(c.dev.port.Num)
	if err != nil || st == verbs.PortActive || st == verbs.PortActiveDefer {
		return nil
	}
	c.M.PortDownBreaks.Add(1)
	return fmt.Errorf("%w: %s port %d is %s", verbs.ErrPortDown, c.ctx.Info().Name, c.dev.port.Num, st)
}

func (c *Client) breakLocked(err error) error {
	if !errors.Is(err, ErrBroken) {
		err = fmt.Errorf("%w: %w", ErrBroken, err)
	}
	c.broken = err
	return err
}

func (c *Client) post(ctx context.Context, op *Op) (pending, error) {
	if c.v1 {
		return c.postV1(ctx, op)
	}
	slot := c.next
	p := pending{op: op, slot: slot}
	req := wire.Request{Op: op.Kind, Tenant: op.Tenant, ID: op.ID, Offset: op.Offset, Length: op.Length}
	hdr := c.hdrBuf.Bytes()[slot*dcp.SlotPayloadOffset : (slot+1)*dcp.SlotPayloadOffset]
	remote := c.seg.Addr + uint64(slot)*c.slotB
	var wrs []verbs.SendWR
	hdrLen := wire.RequestSize
	switch op.Kind {
	case fb.OpPut:
		var total uint64
		for _, v := range op.Value {
			total += uint64(len(v))
		}
		if total == 0 || total > c.tail.MaxBlock {
			return p, fmt.Errorf("onesided: value of %d bytes (1..%d)", total, c.tail.MaxBlock)
		}
		req.PayloadLen = total
		sgl, ok := c.gather(op.Value, &p)
		if !ok { // small unregistered pieces or too many of them: copy into the staging slot
			c.M.StagedOps.Add(1)
			st := c.stageBuf.Bytes()[uint64(slot)*c.slotB:]
			off := 0
			for _, v := range op.Value {
				off += copy(st[off:], v)
			}
			sgl = []verbs.SGE{verbs.SGEOf(c.stage, slot*int(c.slotB), int(total))}
		}
		wrs = append(wrs, verbs.SendWR{ID: c.wrID(slot), Opcode: verbs.OpWrite, SGL: sgl,
			RemoteAddr: remote + dcp.SlotPayloadOffset, RKey: c.seg.RKey})
		c.M.V2PutWrites.Add(1)
	case fb.OpGet:
		var tg []target
		var capacity uint64
		c2 := 0
		for _, d := range op.Dst {
			capacity += uint64(len(d))
			if len(d) > 0 {
				c2++
			}
		}
		if capacity == 0 {
			return p, fmt.Errorf("onesided: GET without a destination")
		}
		p.capSize = capacity
		if op.Direct {
			tg, err := c.directTargets(op, &p, c2)
			if err != nil {
				return p, err
			}
			p.posted = time.Now()
			req.Count = uint32(len(tg))
			for i, t := range tg {
				putTarget(hdr[wire.RequestSize+i*targetSize:], t)
			}
			hdrLen += len(tg) * targetSize
			break
		}
		registered := c2 <= int(c.tail.MaxTargets)
		pool := true
		for _, d := range op.Dst {
			if len(d) == 0 || !registered {
				continue
			}
			m, off, inPool := c.memFor(d, &p)
			if m == nil {
				registered = false
				break
			}
			pool = pool && inPool
			tg = append(tg, target{addr: m.Addr() + uint64(off), rkey: m.RKey() ^ testTargetRKeyXor, len: uint32(len(d))})
		}
		if registered && pool {
			c.M.MRPoolOps.Add(1)
		}
		if !registered {
			c.done(&p)
			c.M.StagedOps.Add(1)
			tg = tg[:0]
			n := min(capacity, c.slotB)
			tg = []target{{addr: c.stage.Addr() + uint64(slot)*c.slotB, rkey: c.stage.RKey(), len: uint32(n)}}
			p.bounce = true
		}
		req.Count = uint32(len(tg))
		for i, t := range tg {
			putTarget(hdr[wire.RequestSize+i*targetSize:], t)
		}
		hdrLen += len(tg) * targetSize
	case fb.OpExist, fb.OpRemove:
	default:
		return p, fmt.Errorf("onesided: op %s not supported over RDMA", op.Kind)
	}
	req.Encode(hdr)
	wrs = append(wrs, verbs.SendWR{ID: c.wrID(slot), Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEOf(c.hdr, slot*dcp.SlotPayloadOffset, hdrLen)}, RemoteAddr: remote, RKey: c.seg.RKey, Imm: uint32(slot)})
	return p, c.postWRs(ctx, op, slot, wrs)
}

// postWRs posts one request's WRs once the send queue has room for them (as on hardware,
// entries come back only with polled completions), and advances the slot.
func (c *Client) postWRs(ctx context.Context, op *Op, slot int, wrs []verbs.SendWR) error {
	if c.sqUsed+len(wrs) > c.sqMax {
		wctx, cancel := context.WithTimeout(ctx, c.cfg.IOTimeout)
		defer cancel()
		for c.sqUsed+len(wrs) > c.sqMax {
			if err := c.reapSend(); err != nil {
				return fmt.Errorf("%w: %w", ErrBroken, err)
			}
			if c.sqUsed+len(wrs) <= c.sqMax {
				break
			}
			if err := c.scq.Wait(wctx); err != nil {
				return fmt.Errorf("%w: waiting for send queue room: %w", ErrBroken, err)
			}
		}
	}
	// The last WR is the one the server acts on: an op is posted once it is queued (a
	// failed post queues none from the failing WR on).
	n, err := c.qp.PostSend(wrs)
	op.Posted = n >= len(wrs)
	if err != nil {
		return fmt.Errorf("%w: post: %w", ErrBroken, err)
	}
	c.sqUsed += len(wrs)
	c.sqFIFO = append(c.sqFIFO, len(wrs))
	c.next = (c.next + 1) % c.depth
	return nil
}

// gather returns SGEs for vs when every piece lies in registered memory (a pool or a
// transient MR, referenced by p) and they fit one WR; else p holds no transient MR.
func (c *Client) gather(vs [][]byte, p *pending) ([]verbs.SGE, bool) {
	var sgl []verbs.SGE
	pool := true
	for _, v := range vs {
		if len(v) == 0 {
			continue
		}
		m, off, inPool := c.memFor(v, p)
		if m == nil {
			c.done(p)
			return nil, false
		}
		pool = pool && inPool
		sgl = append(sgl, verbs.SGEOf(m, off, len(v)))
	}
	if len(sgl) > min(max(c.ctx.Info().MaxSGE, 1), 16) {
		c.done(p)
		return nil, false
	}
	if pool {
		c.M.MRPoolOps.Add(1)
	}
	return sgl, true
}

// memFor resolves one piece of caller memory to the MR that covers it: a registered pool
// (inPool), else a cached or new transient MR (referenced by p until its op completes);
// nil when the piece is better copied (small) or cannot be registered.
func (c *Client) memFor(b []byte, p *pending) (mr verbs.MR, off int, inPool bool) {
	if m, off := c.dev.acquirePool(b); m != nil {
		p.pools = append(p.pools, m)
		return m.mr, off, true
	}
	if len(b) < c.cfg.AdhocMinBytes {
		return nil, 0, false
	}
	if e, off := c.mrs.find(b); e != nil {
		p.tmp = append(p.tmp, e)
		return e.mr, off, false
	}
	e, err := c.mrs.register(c.pd, b)
	if err != nil {
		return nil, 0, false
	}
	p.tmp = append(p.tmp, e)
	return e.mr, 0, false
}

// DeviceTargets reports whether the server accepts GET targets in device memory.
func (c *Client) DeviceTargets() bool { return !c.v1 && c.tail.DeviceTargets }

// directTargets resolves a direct GET's pieces to registered ranges (p takes a reference
// on each), or refuses it: nothing of it may go through staging or a transient MR.
func (c *Client) directTargets(op *Op, p *pending, pieces int) ([]target, error) {
	switch {
	case !c.DeviceTargets():
		return nil, fmt.Errorf("%w: server does not accept device targets (v%d, device_targets %v)", ErrDirectRefused, c.tail.Version, c.tail.DeviceTargets)
	case pieces > int(c.tail.MaxTargets):
		return nil, fmt.Errorf("%w: %d pieces, the server grants %d targets per request", ErrDirectRefused, pieces, c.tail.MaxTargets)
	}
	tg := make([]target, 0, pieces)
	for i, d := range op.Dst {
		if len(d) == 0 {
			continue
		}
		m, off := c.dev.acquirePool(d)
		if m == nil {
			return nil, fmt.Errorf("%w: piece %d (%d bytes at %#x) is not in registered memory", ErrDirectRefused, i, len(d), addrOf(d))
		}
		p.pools = append(p.pools, m)
		tg = append(tg, target{addr: m.mr.Addr() + uint64(off), rkey: m.mr.RKey() ^ testTargetRKeyXor, len: uint32(len(d))})
	}
	c.M.MRPoolOps.Add(1)
	return tg, nil
}

// destroyQP destroys the QP once (Close or a broken window): after it no remote write
// lands in this connection's targets.
func (c *Client) destroyQP() {
	c.qpOnce.Do(func() {
		if c.qp != nil {
			c.qp.Close()
		}
	})
}

// reapSend polls send completions: they reclaim send queue entries and carry errors.
func (c *Client) reapSend() error {
	var wcs [16]verbs.WorkCompletion
	for {
		n, err := c.scq.Poll(wcs[:])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if c.stale(wc) {
				continue
			}
			c.M.Completions.Add(1)
			if wc.Status != verbs.StatusSuccess {
				countError(c.M, wc)
				return wc.Err()
			}
			want := verbs.WCWrite
			if c.v1 {
				want = verbs.WCSend
			}
			if wc.ID&slotMask >= uint64(c.depth) || wc.Opcode != want || len(c.sqFIFO) == 0 {
				return fmt.Errorf("unexpected send completion %+v", wc)
			}
			// Signaled completions arrive in posting order (RC).
			c.sqUsed -= c.sqFIFO[0]
			c.sqFIFO = c.sqFIFO[1:]
		}
		if n < len(wcs) {
			return nil
		}
	}
}

// complete waits for p's reply (the oldest outstanding) and checks the completion.
func (c *Client) complete(ctx context.Context, p pending) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.IOTimeout)
	defer cancel()
	var wcs [1]verbs.WorkCompletion
	start := time.Now()
	var goneAt time.Time
	for {
		if goneAt.IsZero() && c.peerClosed.Load() {
			goneAt = time.Now()
		}
		if err := c.reapSend(); err != nil {
			return err
		}
		n, err := c.rcq.Poll(wcs[:1])
		if err != nil {
			return err
		}
		if n == 1 && c.stale(wcs[0]) {
			continue
		}
		if n == 1 {
			break
		}
		// Both CQs are armed by waiting on the receive CQ with a short slice for the send CQ.
		wctx, wcancel := context.WithTimeout(ctx, pollSlice)
		err = c.rcq.Wait(wctx)
		wcancel()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("reply for slot %d: %w", p.slot, ctx.Err())
		}
		// Neither a dead server nor a port gone down (Soft-RoCE) shows up as a completion
		// soon: both would hold this wait until the I/O timeout.
		if !goneAt.IsZero() && time.Since(goneAt) >= peerGrace {
			return fmt.Errorf("reply for slot %d: %w", p.slot, ErrPeerClosed)
		}
		if time.Since(start) >= lateAfter && time.Since(c.portChecked) >= portCheckEvery {
			if err := c.portDown(); err != nil {
				return fmt.Errorf("reply for slot %d: %w", p.slot, err)
			}
		}
	}
	wc := wcs[0]
	c.M.Completions.Add(1)
	if wc.Status != verbs.StatusSuccess {
		countError(c.M, wc)
		return wc.Err()
	}
	if wc.Opcode != verbs.WCRecv || wc.HasImm || wc.ByteLen < wire.ResponseSize || int(wc.ByteLen) > c.respB ||
		(!c.v1 && wc.ByteLen != wire.ResponseSize) || wc.ID != c.wrID(p.slot) {
		return fmt.Errorf("reply completion %+v for slot %d", wc, p.slot)
	}
	r := c.respBuf.Bytes()[p.slot*c.respB : p.slot*c.respB+int(wc.ByteLen)]
	resp, err := wire.DecodeResponse(r)
	if err != nil {
		return fmt.Errorf("reply prefix: %w", err)
	}
	if resp.Op != p.op.Kind {
		return fmt.Errorf("reply op %s for a %s", resp.Op, p.op.Kind)
	}
	if c.v1 && resp.PayloadLen != uint64(wc.ByteLen)-wire.ResponseSize {
		return fmt.Errorf("reply claims %d payload bytes in a %d-byte message", resp.PayloadLen, wc.ByteLen)
	}
	op := p.op
	op.Status, op.ValueLen = resp.Status, resp.ValueLen
	if c.v1 && op.Kind == fb.OpGet && resp.Status == fb.StatusOk {
		// v1: the value came in the reply; the destination's capacity is checked here.
		if resp.PayloadLen > p.capSize {
			op.Status = fb.StatusBufferTooSmall
		} else {
			st := r[wire.ResponseSize:]
			for _, d := range op.Dst {
				st = st[copy(d, st):]
			}
			op.N = int(resp.PayloadLen)
		}
	}
	if _, err := c.qp.PostRecv([]verbs.RecvWR{{ID: c.wrID(p.slot), SGL: []verbs.SGE{verbs.SGEOf(c.resp, p.slot*c.respB, c.respB)}}}); err != nil {
		return fmt.Errorf("repost receive: %w", err)
	}
	if c.v1 {
		return nil
	}
	if op.Kind == fb.OpGet && resp.Status == fb.StatusOk {
		if resp.PayloadLen > p.capSize {
			return fmt.Errorf("reply claims %d bytes for %d of targets", resp.PayloadLen, p.capSize)
		}
		op.N = int(resp.PayloadLen)
		if op.Direct {
			c.M.DirectGets.Add(1)
			c.M.DirectBytes.Add(int64(op.N))
			c.M.DirectNanos.Add(int64(time.Since(p.posted)))
		}
		if p.bounce {
			st := c.stageBuf.Bytes()[uint64(p.slot)*c.slotB:]
			st = st[:resp.PayloadLen]
			for _, d := range op.Dst {
				st = st[copy(d, st):]
			}
		}
	}
	return nil
}

// postV1 sends one request by SEND: the prefix (and a PUT's payload) gathered from
// registered memory, or copied into the slot's staging buffer.
func (c *Client) postV1(ctx context.Context, op *Op) (pending, error) {
	slot := c.next
	p := pending{op: op, slot: slot}
	req := wire.Request{Op: op.Kind, Tenant: op.Tenant, ID: op.ID, Offset: op.Offset, Length: op.Length}
	hdr := c.hdrBuf.Bytes()[slot*dcp.SlotPayloadOffset : (slot+1)*dcp.SlotPayloadOffset]
	sgl := []verbs.SGE{verbs.SGEOf(c.hdr, slot*dcp.SlotPayloadOffset, wire.RequestSize)}
	switch op.Kind {
	case fb.OpPut:
		var total uint64
		for _, v := range op.Value {
			total += uint64(len(v))
		}
		if total == 0 || total > c.tail.MaxBlock {
			return p, fmt.Errorf("onesided: value of %d bytes (1..%d)", total, c.tail.MaxBlock)
		}
		req.PayloadLen = total
		if g, ok := c.gatherPool(op.Value, &p); ok && len(g)+1 <= min(max(c.ctx.Info().MaxSGE, 1), 16) {
			sgl = append(sgl, g...)
			c.M.MRPoolOps.Add(1)
		} else {
			c.done(&p)
			c.M.StagedOps.Add(1)
			st := c.stageBuf.Bytes()[uint64(slot)*c.slotB:]
			off := 0
			for _, v := range op.Value {
				off += copy(st[off:], v)
			}
			sgl = append(sgl, verbs.SGEOf(c.stage, slot*int(c.slotB), int(total)))
		}
		c.M.V1Puts.Add(1)
	case fb.OpGet:
		for _, d := range op.Dst {
			p.capSize += uint64(len(d))
		}
		if p.capSize == 0 {
			return p, fmt.Errorf("onesided: GET without a destination")
		}
		c.M.V1Gets.Add(1)
	case fb.OpExist, fb.OpRemove:
	default:
		return p, fmt.Errorf("onesided: op %s not supported over RDMA", op.Kind)
	}
	req.Encode(hdr)
	return p, c.postWRs(ctx, op, slot, []verbs.SendWR{{ID: c.wrID(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl}})
}

// gatherPool returns SGEs for vs when every piece lies in a registered pool (referenced by
// p); v1: a SEND copies on the server anyway, so no transient MRs are made for it.
func (c *Client) gatherPool(vs [][]byte, p *pending) ([]verbs.SGE, bool) {
	var sgl []verbs.SGE
	for _, v := range vs {
		if len(v) == 0 {
			continue
		}
		m, off := c.dev.acquirePool(v)
		if m == nil {
			c.done(p)
			return nil, false
		}
		p.pools = append(p.pools, m)
		sgl = append(sgl, verbs.SGEOf(m.mr, off, len(v)))
	}
	return sgl, true
}
