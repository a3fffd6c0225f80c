package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RDMAOptions turn on the RDMA v2 data plane (docs/RDMA.md) towards servers that serve it.
// Scalar and scatter-gather PUT/GET/range/EXIST/REMOVE use it; batch calls stay on TCP.
// A server without RDMA, or a failed bootstrap, leaves that server on TCP, and
// TransportMode says why.
type RDMAOptions struct {
	Provider string // "ibverbs" (default) or "soft" (software NIC: tests and demos)
	Device   string // "" = first device with an ACTIVE port; a named device is a hard selection
	Depth    uint32 // requests in flight per RDMA connection (default 4)
	// MaxBlock is the declared largest value (default 4 MiB, at most Limits.MaxValue). It
	// sizes the server's slots (depth x block per connection); larger values use TCP.
	MaxBlock uint64
	// ForceV1 (DFKV_RDMA_PROTOCOL=1) offers RDMA v1 (SEND/RECV) instead of v2. An auto
	// client that a server answers with v1 reconnects offering v1 on its own.
	ForceV1 bool
}

type rdmaState struct {
	once    sync.Once
	prov    verbs.Provider
	provErr error

	mu      sync.Mutex
	regions [][]byte

	used   atomic.Bool
	reason atomic.Pointer[string]
	m      onesided.Metrics // shared by every RDMA connection of this client
}

// registerRDMAMetrics adds the client's dfkv_rdma_* series to its stats snapshot.
func (c *Client) registerRDMAMetrics() {
	for name := range c.rdma.m.Snapshot() {
		n := name
		f := func() float64 { return c.rdma.m.Snapshot()[n] }
		if strings.HasSuffix(n, "_total") {
			c.m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		} else {
			c.m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		}
	}
}

// peerRDMA is one server's RDMA connection pool.
type peerRDMA struct {
	mu     sync.Mutex
	tcp    bool // the server answered that it does not serve (our) RDMA: stay on TCP
	v1     bool // the server answers v1: offer v1 from the start
	idle   []*onesided.Client
	all    map[*onesided.Client]struct{}
	closed bool
}

func (r *peerRDMA) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for oc := range r.all {
		oc.Close()
	}
	r.all, r.idle = nil, nil
}

func (c *Client) rdmaProvider() (verbs.Provider, error) {
	s := &c.rdma
	s.once.Do(func() {
		switch c.opts.RDMA.Provider {
		case "", "ibverbs":
			s.prov = ibverbs.New(ibverbs.Options{})
		case "soft":
			s.prov, s.provErr = soft.New(soft.Options{})
		default:
			s.provErr = fmt.Errorf("rdma provider %q (want ibverbs or soft)", c.opts.RDMA.Provider)
		}
	})
	return s.prov, s.provErr
}

func (c *Client) setTCPReason(why string) {
	c.rdma.reason.Store(&why)
}

// TransportMode is "tcp" when RDMA is off, "rdma" once an RDMA connection is up, and
// "tcp(<reason>)" when RDMA was asked for but is not in use.
func (c *Client) TransportMode() string {
	if c.opts.RDMA == nil {
		return c.opts.Dialer.Mode()
	}
	if c.rdma.used.Load() {
		return "rdma"
	}
	if r := c.rdma.reason.Load(); r != nil {
		return "tcp(" + *r + ")"
	}
	return "tcp(rdma not negotiated yet)"
}

// RegisterMemory registers buf with every RDMA connection, now and later, so PUT sources
// and GET destinations inside it move without staging copies. Without RDMA it does nothing.
// Registering the same range again is a no-op.
func (c *Client) RegisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("dfkv: register memory: empty range: %w", ErrInvalid)
	}
	if c.opts.RDMA == nil {
		return nil
	}
	s := &c.rdma
	s.mu.Lock()
	for _, r := range s.regions {
		if &r[0] == &buf[0] && len(r) == len(buf) {
			s.mu.Unlock()
			return nil
		}
	}
	s.regions = append(s.regions, buf)
	s.mu.Unlock()
	c.mu.RLock()
	peers := make([]*peer, 0, len(c.peers))
	for _, p := range c.peers {
		peers = append(peers, p)
	}
	c.mu.RUnlock()
	for _, p := range peers {
		p.rdma.mu.Lock()
		for oc := range p.rdma.all {
			if err := oc.RegisterMemory(buf); err != nil {
				p.rdma.mu.Unlock()
				return fmt.Errorf("dfkv: register memory: %w", err)
			}
		}
		p.rdma.mu.Unlock()
	}
	return nil
}

// bufConn reads through the pooled connection's buffered reader.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// rdmaConn returns an idle or new RDMA connection to p, or nil when p is served over TCP.
func (c *Client) rdmaConn(ctx context.Context, p *peer) *onesided.Client {
	o := c.opts.RDMA
	if o == nil {
		return nil
	}
	r := &p.rdma
	r.mu.Lock()
	if r.tcp || r.closed {
		r.mu.Unlock()
		return nil
	}
	if n := len(r.idle); n > 0 {
		oc := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		return oc
	}
	v1 := r.v1 || o.ForceV1
	r.mu.Unlock()
	oc := c.rdmaDial(ctx, p, v1)
	if oc == nil && !v1 && p.rdma.speaksV1() {
		// The server answered v1: never change protocol on that QP; open a fresh connection
		// offering v1.
		oc = c.rdmaDial(ctx, p, true)
	}
	return oc
}

func (r *peerRDMA) speaksV1() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v1
}

// rdmaDial bootstraps one RDMA connection to p offering v1 or v2, or returns nil (TCP).
func (c *Client) rdmaDial(ctx context.Context, p *peer, v1 bool) *onesided.Client {
	o, r := c.opts.RDMA, &p.rdma
	prov, err := c.rdmaProvider()
	if err != nil {
		c.setTCPReason(err.Error())
		return nil
	}
	pc, err := p.dial(ctx, false)
	if err != nil {
		return nil // the TCP path reports the failure
	}
	nc, ok := pc.nc.(net.Conn)
	if !ok { // a transport whose streams are not net.Conns cannot carry the bootstrap
		pc.nc.Close()
		c.setTCPReason("the transport's connections cannot carry the RDMA bootstrap")
		return nil
	}
	pc.nc.SetDeadline(time.Now().Add(c.opts.IOTimeout))
	req := wire.Request{Op: fb.OpRdmaBootstrap}
	var resp wire.Response
	if err = pc.send(&req); err == nil {
		resp, err = pc.recv(fb.OpRdmaBootstrap)
	}
	if err != nil {
		pc.nc.Close()
		return nil
	}
	pc.nc.SetDeadline(time.Time{})
	if resp.Status != fb.StatusOk {
		pc.nc.Close()
		c.markTCP(p, fmt.Sprintf("server %s does not serve RDMA", p.addr))
		return nil
	}
	oc, err := onesided.Dial(bufConn{Conn: nc, r: pc.br}, onesided.Config{Provider: prov, Device: o.Device,
		Depth: c.rdmaDepth(), MaxBlock: c.rdmaBlock(), IOTimeout: c.opts.IOTimeout, Logger: c.opts.Logger, Metrics: &c.rdma.m,
		ForceV1: v1})
	switch {
	case err == nil:
	case errors.Is(err, dcp.ErrFallbackV1):
		r.mu.Lock()
		r.v1 = true
		r.mu.Unlock()
		c.setTCPReason(fmt.Sprintf("server %s answers RDMA v1", p.addr))
		return nil
	case errors.Is(err, verbs.ErrNoDevice), errors.Is(err, verbs.ErrUnavailable), errors.Is(err, dcp.ErrRefused):
		c.markTCP(p, err.Error())
		return nil
	default: // e.g. the server's segment is exhausted right now: this op goes over TCP
		c.setTCPReason(err.Error())
		return nil
	}
	c.rdma.mu.Lock()
	regions := append([][]byte(nil), c.rdma.regions...)
	c.rdma.mu.Unlock()
	for _, b := range regions {
		if err := oc.RegisterMemory(b); err != nil {
			oc.Close()
			c.markTCP(p, "register memory: "+err.Error())
			return nil
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		oc.Close()
		return nil
	}
	if r.all == nil {
		r.all = map[*onesided.Client]struct{}{}
	}
	r.all[oc] = struct{}{}
	c.rdma.used.Store(true)
	return oc
}

func (c *Client) markTCP(p *peer, why string) {
	p.rdma.mu.Lock()
	p.rdma.tcp = true
	p.rdma.mu.Unlock()
	c.opts.Logger.Info("dfkv: rdma not in use for a server; using TCP", "server", p.addr, "reason", why)
	c.setTCPReason(why)
}

// rdmaExec runs op over RDMA when p is served that way; handled is false for TCP peers.
func (c *Client) rdmaExec(ctx context.Context, p *peer, op *onesided.Op) (handled bool, err error) {
	oc := c.rdmaConn(ctx, p)
	if oc == nil {
		return false, nil
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.IOTimeout)
	defer cancel()
	if err := oc.Do(dctx, []*onesided.Op{op}); err != nil {
		p.rdma.mu.Lock()
		delete(p.rdma.all, oc)
		p.rdma.mu.Unlock()
		oc.Close()
		if cerr := ctx.Err(); cerr != nil {
			return true, ctxErr(p.addr, cerr) // the caller's context ended: not the peer's fault
		}
		p.markFailed()
		return true, ioErr(p.addr, err)
	}
	p.markHealthy()
	p.rdma.mu.Lock()
	if !p.rdma.closed && len(p.rdma.idle) < c.opts.PoolSize {
		p.rdma.idle = append(p.rdma.idle, oc)
	} else {
		delete(p.rdma.all, oc)
		oc.Close()
	}
	p.rdma.mu.Unlock()
	return true, nil
}

func (c *Client) rdmaDepth() uint32 {
	if d := c.opts.RDMA.Depth; d > 0 {
		return d
	}
	return 4
}

func (c *Client) rdmaBlock() uint64 {
	b := c.opts.RDMA.MaxBlock
	if b == 0 {
		b = 4 << 20
	}
	return min(b, c.opts.Limits.MaxValue)
}

// rdmaStatus maps an RDMA op's outcome onto the client's errors.
func rdmaStatus(err error, op *onesided.Op) error {
	if err != nil {
		return err
	}
	if op.Status != fb.StatusOk {
		return statusErr(op.Status)
	}
	return nil
}

// rdmaGet is get over RDMA with the TCP path's size contracts: FlagExact (stored length
// must equal the buffer), FlagCap (stored length at most the buffer), or a range.
func (c *Client) rdmaGet(ctx context.Context, p *peer, id identity.ObjectID, segs [][]byte, flags uint8, off, length uint64) (bool, uint64, error) {
	op := &onesided.Op{Kind: fb.OpGet, Tenant: c.tenant, ID: id, Dst: segs}
	if flags == 0 {
		op.Offset, op.Length = off, length
	}
	done, err := c.rdmaExec(ctx, p, op)
	if !done {
		return false, 0, nil
	}
	if err != nil {
		return true, 0, err
	}
	if op.Status == fb.StatusInvalid && op.ValueLen > c.rdmaBlock() {
		return false, 0, nil // larger than this connection's slots: TCP serves it
	}
	switch {
	case op.Status == fb.StatusBufferTooSmall || (op.Status == fb.StatusOk && flags&wire.FlagExact != 0 && op.ValueLen != length):
		return true, 0, fmt.Errorf("dfkv: stored %d bytes, asked %d: %w", op.ValueLen, length, ErrBufferTooSmall)
	case op.Status != fb.StatusOk:
		return true, 0, statusErr(op.Status)
	}
	return true, uint64(op.N), nil
}
