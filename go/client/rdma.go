package client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/railset"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RDMAOptions turn on the RDMA v2 data plane (docs/RDMA.md) towards servers that serve it.
// Scalar, scatter-gather and batch PUT/GET/range/EXIST/REMOVE use it (BatchExistLease stays
// on TCP: leases are a TCP op).
// A server without RDMA, or a failed bootstrap, leaves that server on TCP, and
// TransportMode says why.
type RDMAOptions struct {
	Provider string // "ibverbs" (default) or "soft" (software NIC: tests and demos)
	Device   string // "" = first device with an ACTIVE port; a named device is a hard selection
	// Devices is the rail whitelist (DFKV_RDMA_DEV=a,b): the client opens one shared device
	// per listed rail it uses and, per server, uses only rails that server publishes Healthy
	// (docs/RDMA.md §4, "Client rail selection"). Empty: the one device Device names.
	Devices []string
	// Primary (DFKV_RDMA_PRIMARY_DEV) is preferred inside the tier chosen for a server;
	// without it connections spread round robin over that tier's rails.
	Primary string
	// Tiers (DFKV_RDMA_TIERS=a,b;c) ranks Devices: a lower tier is used only when no rail of
	// a higher one is usable. Against a server that publishes no rails, tiers fail closed.
	Tiers [][]string
	// RailQuarantine is how long a rail that broke towards a server is avoided at most
	// (default 10 s); a successful probe ends it sooner.
	RailQuarantine time.Duration
	// RailProbeInterval is how often a quarantined rail is probed (a fresh connection and
	// one EXIST; default 1 s; < 0 disables probing: only the timer ends a quarantine).
	RailProbeInterval time.Duration
	// RailCredits is each rail's credit budget towards one server: connections in use on
	// it, each a window of up to Depth requests (default MaxConns, else the pool size).
	// With a whitelist, an op that finds every rail of its tier at the budget waits
	// (bounded by its context and IOTimeout, then ErrTimeout); it never moves to a lower
	// tier or to TCP for congestion (docs/RDMA.md §4, "Credits and backpressure").
	RailCredits int
	// RailSlowFactor demotes, inside the chosen tier, a rail whose per-op latency EWMA
	// towards a server is above this many times the tier's fastest rail (DFKV_RDMA_RAIL_
	// SLOW_FACTOR; 0 = default 4, < 0 = off, else >= 1). A demoted rail keeps a small
	// share of picks so it can recover; latency never moves traffic to a lower tier
	// (docs/RDMA.md §4, "Latency").
	RailSlowFactor float64
	// NUMA (DFKV_RDMA_NUMA=1) prefers, inside the chosen tier, rails whose device is on
	// NUMANode (AutoNUMANode: the node of the CPU that calls New).
	NUMA     bool
	NUMANode int
	// SoftNUMANodes gives the soft provider's devices NUMA nodes (softN gets entry N; the
	// C ABI maps DFKV_SOFT_RDMA_NUMA). Tests only.
	SoftNUMANodes []int
	// SoftDevices and SoftFaultFile are the soft provider's device count (at least one per
	// softN named) and its test-only fault file (soft.ParseFaults); the C ABI maps
	// DFKV_SOFT_RDMA_DEVICES and DFKV_SOFT_RDMA_FAULTS. Ignored by other providers.
	SoftDevices   int
	SoftFaultFile string
	// SoftNoDMABuf makes the soft provider refuse RegisterDMABuf as a NIC without DMA-BUF
	// import does (EOPNOTSUPP). Test-only.
	SoftNoDMABuf bool
	Depth        uint32 // requests in flight per RDMA connection (default 4)
	// MaxBlock is the declared largest value (default 4 MiB, at most Limits.MaxValue). It
	// sizes the server's slots (depth x block per connection); larger values use TCP.
	MaxBlock uint64
	// ForceV1 (DFKV_RDMA_PROTOCOL=1) offers RDMA v1 (SEND/RECV) instead of v2. An auto
	// client that a server answers with v1 reconnects offering v1 on its own.
	ForceV1 bool
	// MaxConns bounds the RDMA connections to one server (default Options.PoolSize); an op
	// that finds them all busy goes over TCP. With a rail whitelist the per-rail credits
	// (RailCredits) bound them instead and a busy rail makes the op wait.
	MaxConns int
	// IdleTimeout: a pooled RDMA connection idle this long is closed (QP and CQs destroyed,
	// the server's receive-segment lease returned); default 60 s.
	IdleTimeout time.Duration
	// SGLaneConns bounds the SG lane's connections to one server (multi-SGE requests, one
	// in flight per connection; docs/RDMA.md, "SG lane"); default MaxConns.
	SGLaneConns int
	// MRCacheBytes bounds each connection's cache of transient MRs for unregistered
	// memory (default 32 MiB); < 0 deregisters every transient MR after its op (memory the
	// Go runtime does not own, e.g. the C ABI's callers).
	MRCacheBytes int64
	// Notify (DFKV_RDMA_NOTIFY=1) offers native notifications on each RDMA connection: the
	// server's drain notice arrives over RDMA and a draining connection is never reused;
	// Close says goodbye natively (docs/RDMA.md, "Notifications").
	Notify bool
	// NotifyOOBFallback (DFKV_RDMA_NOTIFY_OOB_FALLBACK=1): notifications a server cannot take
	// natively go over the bootstrap TCP connection instead of failing.
	NotifyOOBFallback bool
	// RefusalBackoff is how long a server that refused RDMA (no RDMA there, a refused or
	// failed handshake) is served over TCP before the next bootstrap; it doubles with each
	// further refusal up to RefusalBackoffMax and resets on success. Default 1 s and 60 s
	// (DFKV_RDMA_REFUSAL_BACKOFF_MS sets the base in the C ABI).
	RefusalBackoff    time.Duration
	RefusalBackoffMax time.Duration
	// GIDIndex (DFKV_RDMA_GID_INDEX) forces the source GID index of every connection;
	// nil chooses per connection from the addresses in use (docs/RDMA.md §8).
	GIDIndex *int
	// HopLimit (DFKV_RDMA_HOP_LIMIT) of RoCE v2 packets; 0 = 64.
	HopLimit uint8
	// TrafficClass (DFKV_RDMA_TRAFFIC_CLASS) is the RoCE packets' DSCP<<2|ECN byte.
	TrafficClass uint8
}

// AutoNUMANode in RDMAOptions.NUMANode: the node of the CPU that calls New.
const AutoNUMANode = -1

// gidPolicy is the options' part of each connection's GID choice.
func (o *RDMAOptions) gidPolicy() verbs.GIDPolicy {
	p := verbs.GIDPolicy{HopLimit: o.HopLimit, TrafficClass: o.TrafficClass}
	if o.GIDIndex != nil {
		p.Index, p.HasIndex = *o.GIDIndex, true
	}
	return p
}

// newRailSet builds the client's RDMA transport (package railset: rail policy, pools, SG
// lane). Without RDMA it only keeps RegisterMemory's ranges.
func (c *Client) newRailSet() (*railset.Set, error) {
	o := railset.Options{PoolSize: c.opts.PoolSize, IOTimeout: c.opts.IOTimeout, MaxValue: c.opts.Limits.MaxValue,
		Tenant: c.tenant, Logger: c.opts.Logger,
		Errors: railset.Errors{Invalid: ErrInvalid, Timeout: ErrTimeout, Closed: ErrClosed, Busy: ErrBusy, Ctx: ctxErr, IO: ioErr}}
	if r := c.opts.RDMA; r != nil {
		o.Provider, o.Device, o.Devices, o.Primary, o.Tiers = r.Provider, r.Device, r.Devices, r.Primary, r.Tiers
		o.RailQuarantine, o.RailProbeInterval, o.RailCredits, o.RailSlowFactor = r.RailQuarantine, r.RailProbeInterval, r.RailCredits, r.RailSlowFactor
		o.NUMA, o.NUMANode, o.SoftNUMANodes, o.SoftDevices, o.SoftFaultFile = r.NUMA, r.NUMANode, r.SoftNUMANodes, r.SoftDevices, r.SoftFaultFile
		o.SoftNoDMABuf = r.SoftNoDMABuf
		o.Depth, o.MaxBlock, o.ForceV1, o.MaxConns, o.IdleTimeout = r.Depth, r.MaxBlock, r.ForceV1, r.MaxConns, r.IdleTimeout
		o.SGLaneConns, o.MRCacheBytes, o.Notify, o.NotifyOOBFallback = r.SGLaneConns, r.MRCacheBytes, r.Notify, r.NotifyOOBFallback
		o.RefusalBackoff, o.RefusalBackoffMax, o.GID = r.RefusalBackoff, r.RefusalBackoffMax, r.gidPolicy()
		o.Registerer = c.m.reg
		if rp, ok := c.opts.Membership.(railPublisher); ok {
			o.Published = func(addr string) []wire.Rail {
				rails, _ := rp.PublishedRails(addr)
				return rails
			}
		}
	}
	return railset.New(o)
}

// railPublisher is a membership that knows each member's published RDMA rails (the MDS
// topology's Member.rails). A static membership is not one.
type railPublisher interface {
	PublishedRails(addr string) (rails []wire.Rail, known bool)
}

// TransportMode is "tcp" when RDMA is off, "rdma" once an RDMA connection is up, and
// "tcp(<reason>)" when RDMA was asked for but is not in use.
func (c *Client) TransportMode() string {
	if c.opts.RDMA == nil {
		return c.opts.Dialer.Mode()
	}
	return c.rdma.Mode()
}

// RegisterMemory registers buf for RDMA once per device (not per connection), now and for a
// device opened later, so PUT sources and GET destinations inside it move without staging
// copies on every RDMA connection. Without RDMA it only records the range (for
// UnregisterMemory). Registering the same range again is a no-op. The memory must stay
// valid until UnregisterMemory or Close.
func (c *Client) RegisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("dfkv: register memory: empty range: %w", ErrInvalid)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	return c.rdma.RegisterMemory(buf)
}

// UnregisterMemory undoes RegisterMemory for exactly the range buf was registered as (an
// unknown range is ErrInvalid). New ops stop using the registration at once; it waits for
// the in-flight ops that use it (at most twice the I/O timeout, else ErrBusy and the range
// stays registered), then deregisters it on every device. After it returns nil the caller
// may free or reuse the memory.
func (c *Client) UnregisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("dfkv: unregister memory: empty range: %w", ErrInvalid)
	}
	return c.rdma.UnregisterMemory(buf)
}

// rdmaHost is a peer as its RDMA transport sees it: the TCP bootstrap request and health.
type rdmaHost struct{ p *peer }

func (h rdmaHost) Addr() string { return h.p.addr }
func (h rdmaHost) MarkHealthy() { h.p.markHealthy() }
func (h rdmaHost) MarkFailed()  { h.p.markFailed() }

// Bootstrap dials a fresh connection (HELLO included) and asks the server for RDMA on it.
func (h rdmaHost) Bootstrap(ctx context.Context) (net.Conn, error) {
	p := h.p
	pc, err := p.dial(ctx, false)
	if err != nil {
		return nil, err // the TCP path reports the failure
	}
	nc, ok := pc.nc.(net.Conn)
	if !ok { // a transport whose streams are not net.Conns cannot carry the bootstrap
		pc.nc.Close()
		return nil, railset.ErrNoNetConn
	}
	// A caller that gives up interrupts the request by closing its connection.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	pc.nc.SetDeadline(time.Now().Add(p.cfg.ioTimeout))
	req := wire.Request{Op: fb.OpRdmaBootstrap}
	var resp wire.Response
	if err = pc.send(&req); err == nil {
		resp, err = pc.recv(fb.OpRdmaBootstrap)
	}
	if err != nil {
		pc.nc.Close()
		return nil, fmt.Errorf("dfkv: rdma bootstrap request to %s: %w", p.addr, err)
	}
	pc.nc.SetDeadline(time.Time{})
	if resp.Status != fb.StatusOk {
		pc.nc.Close()
		return nil, railset.ErrNotServed
	}
	return bufConn{Conn: nc, r: pc.br}, nil
}

// bufConn reads through the pooled connection's buffered reader.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// rdmaExec runs op over RDMA when p is served that way; handled is false for TCP peers.
func (c *Client) rdmaExec(ctx context.Context, p *peer, op *onesided.Op) (handled bool, err error) {
	if c.opts.RDMA == nil {
		return false, nil
	}
	return p.rdma.Exec(ctx, op)
}

func (c *Client) rdmaBlock() uint64 { return c.rdma.MaxBlock() }

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
	return c.rdmaGetResult(op, flags, length)
}

// rdmaGetResult maps a GET's reply onto the TCP path's contracts; handled is false when the
// value is larger than the connection's declared block (TCP serves it).
func (c *Client) rdmaGetResult(op *onesided.Op, flags uint8, length uint64) (handled bool, n uint64, err error) {
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

// rdmaChunk runs one batch chunk over RDMA as a window of requests on one connection (the
// items in order, up to the negotiated depth in flight, replies in order) and returns the
// items left for TCP: all of them when the server is served over TCP, else those larger
// than the connection's declared block. BatchExistLease stays on TCP.
func (c *Client) rdmaChunk(ctx context.Context, op fb.Op, flags uint8, ch chunk) []*Item {
	var kind wire.Op
	switch op {
	case fb.OpBatchPut:
		kind = fb.OpPut
	case fb.OpBatchGet:
		kind = fb.OpGet
	case fb.OpBatchExist:
		kind = fb.OpExist
	case fb.OpBatchRemove:
		kind = fb.OpRemove
	default:
		return ch.items
	}
	block := c.rdmaBlock()
	ops := make([]*onesided.Op, 0, len(ch.items))
	its := make([]*Item, 0, len(ch.items))
	var rest []*Item
	for _, it := range ch.items {
		o := &onesided.Op{Kind: kind, Tenant: c.tenant, ID: it.id}
		switch op {
		case fb.OpBatchPut:
			if segsLen(it.segs(false)) > block {
				rest = append(rest, it)
				continue
			}
			o.Value = it.segs(false)
		case fb.OpBatchGet:
			o.Dst, o.Direct = it.segs(true), it.direct
		}
		ops, its = append(ops, o), append(its, it)
	}
	if len(ops) == 0 {
		return rest
	}
	done, unsent, err := ch.p.rdma.Run(ctx, ops)
	if !done {
		return c.notDirect(ch.p, ch.items)
	}
	for i, o := range ops {
		it := its[i]
		if o.Direct {
			if unsent[o] {
				it.Err = c.directRefusal(ch.p, nil)
				continue
			}
			if o.Refused != nil {
				it.Err = c.directRefusal(ch.p, o.Refused)
				continue
			}
		}
		if unsent[o] { // never submitted (a full pool or lane): TCP serves it
			rest = append(rest, it)
			continue
		}
		if err != nil && o.Status == fb.StatusUnavailable { // not completed: the connection broke
			it.Err = err
			continue
		}
		switch op {
		case fb.OpBatchPut:
			it.Err = statusErr(o.Status)
			if it.Err == nil {
				it.N = int64(segsLen(o.Value))
			}
		case fb.OpBatchGet:
			length := segsLen(o.Dst)
			ok, n, gerr := c.rdmaGetResult(o, flags, length)
			if !ok && o.Direct {
				it.Err = fmt.Errorf("dfkv: direct get: stored %d bytes, above the RDMA block of %d: %w", o.ValueLen, c.rdmaBlock(), ErrDirectUnsupported)
				continue
			}
			if !ok {
				rest = append(rest, it) // larger than the declared block
				continue
			}
			it.Err, it.N = gerr, int64(n)
		case fb.OpBatchExist:
			it.Err, it.N = statusErr(o.Status), int64(o.ValueLen)
		case fb.OpBatchRemove:
			it.Err = statusErr(o.Status)
		}
	}
	return rest
}
