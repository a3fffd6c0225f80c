package soft

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Options configures a soft provider.
type Options struct {
	// Devices is how many devices (soft0, soft1, ...) the process has (1..MaxDevices);
	// 0 = DFKV_SOFT_RDMA_DEVICES, else 1.
	Devices int
	// FaultFile is the test-only fault injection file (ParseFaults); "" =
	// DFKV_SOFT_RDMA_FAULTS, else none.
	FaultFile string
	// NUMANodes gives device softN the NUMA node NUMANodes[N] (devices past the list, or
	// without it, report -1: unknown). Lets tests exercise NUMA-local rail selection.
	NUMANodes []int
	// AckTimeout bounds how long a requester waits for its peer's next response, and how
	// long a responder waits for a QP that is not yet RTR (hardware: the transport retry
	// timer times retry count). Default 10 s.
	AckTimeout time.Duration
	// RNRTimeout bounds how long an incoming SEND or WRITE_WITH_IMM waits for a posted
	// receive before it is NAKed receiver-not-ready. Default 2 s.
	RNRTimeout time.Duration
	// MaxMsg is the largest message (port max_msg_sz). Default 1 GiB.
	MaxMsg uint32
	// AckDelay, when set, is an injected fault: the responder waits the returned duration
	// before acknowledging a request of the given opcode (e.g. to hold a SEND completion).
	AckDelay func(op verbs.Opcode) time.Duration
	// NoDMABuf makes RegDMABuf fail as a NIC without DMA-BUF import does (EOPNOTSUPP).
	NoDMABuf bool
	Logger   *slog.Logger
}

// Device limits the soft NIC reports and enforces.
const (
	maxQPWR  = 16384
	maxSGE   = 32
	maxCQE   = 1 << 20
	portMTU  = 4096
	portNum  = 1
	maxMRLen = 1 << 40
)

// Provider is the soft provider. The zero value is not usable; call New.
type Provider struct {
	opt    Options
	devs   []*device
	faults *faultFile // nil without a fault file
}

// New creates a soft provider with its devices (nothing listens until a device is opened).
func New(opt Options) (*Provider, error) {
	if opt.Devices <= 0 {
		opt.Devices = 1
	}
	if opt.Devices > MaxDevices {
		return nil, fmt.Errorf("soft: %d devices (max %d)", opt.Devices, MaxDevices)
	}
	if opt.AckTimeout <= 0 {
		opt.AckTimeout = 10 * time.Second
	}
	if opt.RNRTimeout <= 0 {
		opt.RNRTimeout = 2 * time.Second
	}
	if opt.MaxMsg == 0 {
		opt.MaxMsg = 1 << 30
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	p := &Provider{opt: opt}
	if opt.FaultFile != "" {
		p.faults = &faultFile{path: opt.FaultFile, p: p}
	}
	for i := range opt.Devices {
		var gid verbs.GID
		gid[0], gid[1] = 0xfe, 0x80 // link-local prefix, as RoCE's default GID
		if _, err := rand.Read(gid[8:]); err != nil {
			return nil, fmt.Errorf("soft: device GID: %w", err)
		}
		var kb [4]byte
		if _, err := rand.Read(kb[:]); err != nil {
			return nil, fmt.Errorf("soft: key seed: %w", err)
		}
		seed := binary.LittleEndian.Uint32(kb[:])
		p.devs = append(p.devs, &device{
			p:       p,
			name:    fmt.Sprintf("soft%d", i),
			numa:    numaOf(opt.NUMANodes, i),
			gid:     gid,
			nextKey: seed & 0x00ffff00,
			nextQPN: 0x100 + seed&0xfff,
			mrs:     map[uint32]*mr{},
			qps:     map[uint32]*qp{},

			noDMABuf: opt.NoDMABuf,
		})
	}
	return p, nil
}

func numaOf(nodes []int, i int) int {
	if i < len(nodes) && nodes[i] >= 0 {
		return nodes[i]
	}
	return -1
}

// Name implements verbs.Provider.
func (p *Provider) Name() string { return "soft" }

// Devices implements verbs.Provider.
func (p *Provider) Devices() ([]verbs.DeviceInfo, error) {
	out := make([]verbs.DeviceInfo, 0, len(p.devs))
	for _, d := range p.devs {
		if p.faults.get(d.name).QueryFail {
			continue // the injected fault: this device's query failed
		}
		out = append(out, d.info())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("soft: every device's query failed (fault file): %w", verbs.ErrNoDevice)
	}
	return out, nil
}

// Open implements verbs.Provider.
func (p *Provider) Open(name string) (verbs.Context, error) {
	for _, d := range p.devs {
		if d.name == name {
			if err := d.acquire(); err != nil {
				return nil, err
			}
			return &devContext{d: d}, nil
		}
	}
	return nil, fmt.Errorf("soft: open %q: %w", name, verbs.ErrNoDevice)
}

// Usage counts what is open on one device: contexts, protection domains and memory
// regions (tests assert sharing and leaks with it).
type Usage struct {
	Contexts, PDs, MRs int
}

// Usage reports what is open on the named device (false when there is no such device).
func (p *Provider) Usage(name string) (Usage, bool) {
	for _, d := range p.devs {
		if d.name == name {
			d.mu.Lock()
			defer d.mu.Unlock()
			return Usage{Contexts: d.refs, PDs: d.pds, MRs: len(d.mrs)}, true
		}
	}
	return Usage{}, false
}

// sockName is the abstract unix socket a device with this GID listens on.
func sockName(g verbs.GID) string { return "@dfkv-soft-" + hex.EncodeToString(g[:]) }

type device struct {
	p    *Provider
	name string
	gid  verbs.GID
	numa int

	mu      sync.Mutex
	refs    int
	ln      net.Listener
	acceptW sync.WaitGroup
	nextKey uint32
	nextQPN uint32
	mrs     map[uint32]*mr
	qps     map[uint32]*qp
	pds     int                   // protection domains allocated and not closed
	inbound map[net.Conn]struct{} // accepted streams not yet bound to a QP
	done    chan struct{}         // closed when the last context closes

	lastMu sync.Mutex // a leaf lock (taken under a QP's mu)
	lastWC *verbs.WorkCompletion

	noDMABuf bool // Options.NoDMABuf
}

// recordWC remembers the device's last successful send completion (the stale_wc fault
// replays it on another QP).
func (d *device) recordWC(wc verbs.WorkCompletion) {
	d.lastMu.Lock()
	d.lastWC = &wc
	d.lastMu.Unlock()
}

// lastWCOfOther returns the last recorded send completion when another QP than qpn made it.
func (d *device) lastWCOfOther(qpn uint32) (verbs.WorkCompletion, bool) {
	d.lastMu.Lock()
	defer d.lastMu.Unlock()
	if d.lastWC == nil || d.lastWC.QPNum == qpn {
		return verbs.WorkCompletion{}, false
	}
	return *d.lastWC, true
}

// fault is the device's injected state (zero without a fault file).
func (d *device) fault() Fault { return d.p.faults.get(d.name) }

func (d *device) info() verbs.DeviceInfo {
	state, phys := verbs.PortActive, verbs.PhysLinkUp
	if f := d.fault(); f.PortDown || f.PortStall {
		state, phys = verbs.PortDown, verbs.PhysDisabled
	}
	return verbs.DeviceInfo{
		Name:     d.name,
		NUMANode: d.numa,
		Ports: []verbs.PortInfo{{
			Num: portNum, State: state, PhysState: phys,
			GID: d.gid, MTU: portMTU, LinkLayer: "Ethernet",
		}},
		MaxQPWR: maxQPWR, MaxSGE: maxSGE, MaxCQE: maxCQE, MaxMRLen: maxMRLen,
	}
}

func (d *device) acquire() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		ln, err := net.Listen("unix", sockName(d.gid))
		if err != nil {
			return fmt.Errorf("soft: %s listen: %w", d.name, err)
		}
		d.ln = ln
		d.inbound = map[net.Conn]struct{}{}
		d.done = make(chan struct{})
		d.acceptW.Add(1)
		go d.acceptLoop(ln)
	}
	d.refs++
	return nil
}

func (d *device) release() {
	d.mu.Lock()
	d.refs--
	if d.refs > 0 {
		d.mu.Unlock()
		return
	}
	ln := d.ln
	d.ln = nil
	close(d.done)
	for c := range d.inbound {
		c.Close()
	}
	d.mu.Unlock()
	ln.Close()
	d.acceptW.Wait()
}

func (d *device) acceptLoop(ln net.Listener) {
	defer d.acceptW.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by release
		}
		d.mu.Lock()
		if d.ln != ln {
			d.mu.Unlock()
			c.Close()
			return
		}
		d.inbound[c] = struct{}{}
		d.acceptW.Add(1)
		d.mu.Unlock()
		go func() {
			defer d.acceptW.Done()
			d.bindInbound(c)
		}()
	}
}

// bindInbound reads a requester's hello and hands the stream to the QP it names once that QP
// is ready to receive (RTR or later) and is connected to the requester.
func (d *device) bindInbound(c net.Conn) {
	opt := d.p.opt
	fail := func(why string, args ...any) {
		d.mu.Lock()
		delete(d.inbound, c)
		d.mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write(response{kind: kNak, status: verbs.StatusRemInvReqErr}.encode())
		c.Close()
		opt.Logger.Debug("soft: refused inbound stream", append([]any{"device", d.name, "why", why}, args...)...)
	}
	c.SetReadDeadline(time.Now().Add(opt.AckTimeout))
	var hb [helloLen]byte
	if _, err := readFull(c, hb[:]); err != nil {
		fail("no hello", "err", err)
		return
	}
	h, err := decodeHello(hb[:])
	if err != nil {
		fail("bad hello", "err", err)
		return
	}
	if d.fault().PortDown {
		fail("port down (injected)")
		return
	}
	deadline := time.Now().Add(opt.AckTimeout)
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	for {
		d.mu.Lock()
		q := d.qps[h.dstQPN]
		d.mu.Unlock()
		if q == nil {
			fail("no such qp", "qpn", h.dstQPN)
			return
		}
		ok, changed, err := q.acceptInbound(h, c)
		if err != nil {
			fail(err.Error(), "qpn", h.dstQPN)
			return
		}
		if ok {
			d.mu.Lock()
			delete(d.inbound, c)
			d.mu.Unlock()
			return
		}
		// Not yet RTR: the peer raced ahead in connection setup. Wait, bounded.
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-changed:
			t.Stop()
		case <-done:
			t.Stop()
			fail("device closed")
			return
		case <-t.C:
			fail("qp not ready", "qpn", h.dstQPN)
			return
		}
	}
}

func (d *device) lookupMR(key uint32) *mr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mrs[key]
}

type devContext struct {
	d      *device
	mu     sync.Mutex
	closed bool
}

func (c *devContext) Info() verbs.DeviceInfo { return c.d.info() }

// PortState implements verbs.PortStater (the port's state now, faults included).
func (c *devContext) PortState(port uint8) (verbs.PortState, error) {
	if port != portNum {
		return 0, fmt.Errorf("%w: port %d (soft devices have port %d)", verbs.ErrInvalid, port, portNum)
	}
	return c.d.info().Ports[0].State, nil
}

// GIDTable implements verbs.Context: a soft port has one GID, its link-local RoCE v2 entry
// at index 0 (the only address its socket answers on), so the same selection code runs
// over it as over hardware.
func (c *devContext) GIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port != portNum {
		return nil, fmt.Errorf("%w: port %d (soft devices have port %d)", verbs.ErrInvalid, port, portNum)
	}
	return []verbs.GIDEntry{{Index: 0, GID: c.d.gid, Type: verbs.GIDTypeRoCEv2}}, nil
}

func (c *devContext) AllocPD() (verbs.PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, verbs.ErrClosed
	}
	c.d.mu.Lock()
	c.d.pds++
	c.d.mu.Unlock()
	return &pd{ctx: c}, nil
}

func (c *devContext) CreateCQ(depth int) (verbs.CQ, error) {
	if depth <= 0 || depth > maxCQE {
		return nil, fmt.Errorf("%w: cq depth %d (max %d)", verbs.ErrInvalid, depth, maxCQE)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, verbs.ErrClosed
	}
	return newCQ(depth), nil
}

func (c *devContext) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.d.release()
	return nil
}

type pd struct {
	ctx    *devContext
	closed sync.Once
}

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 || uint64(len(buf)) > maxMRLen {
		return nil, fmt.Errorf("%w: register %d bytes", verbs.ErrInvalid, len(buf))
	}
	// As in verbs: remote write (and atomics) need local write too.
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write access requires local write", verbs.ErrInvalid)
	}
	return p.register(buf, uint64(uintptr(unsafe.Pointer(&buf[0]))), access, nil), nil
}

// register makes buf an MR named by peers as [addr, addr+len(buf)); unmap (may be nil)
// runs once Close has waited out every transfer touching buf.
func (p *pd) register(buf []byte, addr uint64, access verbs.Access, unmap func()) *mr {
	d := p.ctx.d
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextKey += 0x100
	key := d.nextKey | uint32(len(d.mrs)&0xff)
	for d.mrs[key] != nil {
		d.nextKey += 0x100
		key = d.nextKey
	}
	m := &mr{pd: p, buf: buf, addr: addr, key: key, access: access, unmap: unmap}
	d.mrs[key] = m
	return m
}

// RegDMABuf stands in for ibv_reg_dmabuf_mr: the soft NIC maps the buffer itself (a memfd
// or a udmabuf: anything mmap-able) and places bytes through that mapping, so the caller's
// own mapping of the same buffer (its "device" allocation) sees them without any copy by
// the caller; peers name it by iova, as with a real NIC.
func (p *pd) RegDMABuf(fd int, offset, size, iova uint64, access verbs.Access) (verbs.MR, error) {
	if fd < 0 || size == 0 || size > maxMRLen || iova == 0 || iova+size < iova {
		return nil, fmt.Errorf("%w: register dmabuf fd %d, %d bytes at iova %#x", verbs.ErrInvalid, fd, size, iova)
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write access requires local write", verbs.ErrInvalid)
	}
	if p.ctx.d.noDMABuf {
		return nil, fmt.Errorf("%w: soft device %s: EOPNOTSUPP (configured without DMA-BUF)", verbs.ErrDMABufUnsupported, p.ctx.d.name)
	}
	buf, unmap, err := mapDMABuf(fd, offset, size)
	if err != nil {
		return nil, err
	}
	return p.register(buf, iova, access, unmap), nil
}

func (p *pd) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	if cfg.Type != verbs.QPTypeRC {
		return nil, fmt.Errorf("%w: qp type %d (only RC)", verbs.ErrInvalid, cfg.Type)
	}
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, fmt.Errorf("%w: qp without CQs", verbs.ErrInvalid)
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: CQ from another provider", verbs.ErrInvalid)
	}
	if cfg.MaxSendWR <= 0 || cfg.MaxSendWR > maxQPWR || cfg.MaxRecvWR < 0 || cfg.MaxRecvWR > maxQPWR ||
		cfg.MaxSendSGE <= 0 || cfg.MaxSendSGE > maxSGE || cfg.MaxRecvSGE < 0 || cfg.MaxRecvSGE > maxSGE {
		return nil, fmt.Errorf("%w: qp caps %d/%d WRs, %d/%d SGEs (max %d, %d)", verbs.ErrInvalid,
			cfg.MaxSendWR, cfg.MaxRecvWR, cfg.MaxSendSGE, cfg.MaxRecvSGE, maxQPWR, maxSGE)
	}
	d := p.ctx.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.ctx.closed {
		return nil, verbs.ErrClosed
	}
	d.nextQPN = (d.nextQPN + 1) & psnMask
	if d.nextQPN < 0x100 {
		d.nextQPN = 0x100
	}
	q := newQP(d, p, d.nextQPN, cfg, scq, rcq)
	d.qps[q.num] = q
	return q, nil
}

func (p *pd) Close() error {
	p.closed.Do(func() {
		d := p.ctx.d
		d.mu.Lock()
		d.pds--
		d.mu.Unlock()
	})
	return nil
}

type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	key    uint32
	access verbs.Access

	// mu is held for reading while bytes move in or out of buf, so that Close returns only
	// when no transfer touches the memory any more (the caller may unmap it next).
	mu     sync.RWMutex
	closed bool
	unmap  func() // RegDMABuf's mapping, released after the last transfer
}

func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Len() int             { return len(m.buf) }
func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Access() verbs.Access { return m.access }
func (m *mr) Bytes() []byte        { return m.buf }

func (m *mr) Close() error {
	d := m.pd.ctx.d
	d.mu.Lock()
	if d.mrs[m.key] == m {
		delete(d.mrs, m.key)
	}
	d.mu.Unlock()
	m.mu.Lock()
	first := !m.closed
	m.closed = true
	m.mu.Unlock()
	if first && m.unmap != nil {
		m.unmap()
	}
	return nil
}

// span returns buf[addr-m.addr : +n] if [addr, addr+n) lies inside the MR. The caller holds
// m.mu for reading and has checked !m.closed.
func (m *mr) span(addr uint64, n uint32) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || uint64(n) > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+uint64(n)], true
}

// cq is a completion queue: a bounded FIFO and a broadcast channel for waiters.
type cq struct {
	mu       sync.Mutex
	depth    int
	q        []verbs.WorkCompletion
	overflow bool
	closed   bool
	ready    chan struct{} // closed and replaced on every push
	done     chan struct{}
}

func newCQ(depth int) *cq {
	return &cq{depth: depth, ready: make(chan struct{}), done: make(chan struct{})}
}

func (c *cq) push(wcs ...verbs.WorkCompletion) {
	if len(wcs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, wc := range wcs {
		if len(c.q) >= c.depth {
			c.overflow = true
			break
		}
		c.q = append(c.q, wc)
	}
	close(c.ready)
	c.ready = make(chan struct{})
}

func (c *cq) Poll(wcs []verbs.WorkCompletion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, verbs.ErrClosed
	}
	if c.overflow {
		return 0, verbs.ErrCQOverflow
	}
	n := copy(wcs, c.q)
	c.q = c.q[:copy(c.q, c.q[n:])]
	return n, nil
}

func (c *cq) Wait(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return verbs.ErrClosed
	}
	if len(c.q) > 0 || c.overflow {
		c.mu.Unlock()
		return nil
	}
	ch := c.ready
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-c.done:
		return verbs.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	return nil
}

func readFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }
