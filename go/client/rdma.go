package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
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
	Depth         uint32 // requests in flight per RDMA connection (default 4)
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

// gidPolicy is the options' part of each connection's GID choice.
func (o *RDMAOptions) gidPolicy() verbs.GIDPolicy {
	p := verbs.GIDPolicy{HopLimit: o.HopLimit, TrafficClass: o.TrafficClass}
	if o.GIDIndex != nil {
		p.Index, p.HasIndex = *o.GIDIndex, true
	}
	return p
}

type rdmaState struct {
	once    sync.Once
	prov    verbs.Provider
	provErr error

	mu      sync.Mutex
	regions [][]byte                    // RegisterMemory's ranges, registered on every device opened
	devs    map[string]*onesided.Device // per rail, opened by its first connection; shared by all
	closed  bool

	rc railConfig   // rail policy (validated in New)
	rm *railMetrics // per-rail series
	rx railState    // NUMA view, probers
	sg *sgLaneMetrics

	used   atomic.Bool
	reason atomic.Pointer[string]
	m      onesided.Metrics // shared by every RDMA connection of this client

	janitorOnce sync.Once
	stopJanitor chan struct{}
	janitorDone chan struct{}
}

// registerRDMAMetrics adds the client's dfkv_rdma_* series to its stats snapshot.
func (c *Client) registerRDMAMetrics() {
	c.rdma.rm = newRailMetrics(c.m.reg)
	c.rdma.rx.numaNode = c.opts.RDMA.NUMANode
	if c.rdma.rx.numaNode < 0 {
		c.rdma.rx.numaNode = callerNUMANode()
	}
	c.registerSGLaneMetrics()
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
	mu      sync.Mutex
	refusal refusalBackoff              // the server refused RDMA: stay on TCP for a while
	v1      bool                        // the server answers v1: offer v1 from the start
	idle    []idleConn                  // most recently used last
	all     map[*onesided.Client]string // every open connection and its rail
	quar    map[string]time.Time        // rail -> quarantined towards this server until
	rr      uint32                      // round robin over the chosen tier's rails
	dialing int                         // bootstraps in progress (count against MaxConns)
	sg      sgLane                      // multi-SGE requests' own connections (sglane.go)
	closed  bool
	px      railPeerState // credits, probers (railcredits.go, railprobe.go)
}

type idleConn struct {
	oc    *onesided.Client
	rail  string
	since time.Time
}

// reclaim closes the idle connections unused since before cutoff.
func (r *peerRDMA) reclaim(cutoff time.Time, m *onesided.Metrics) {
	r.mu.Lock()
	old := r.takeIdleLocked(func(ic idleConn) bool { return ic.since.Before(cutoff) })
	old = append(old, r.sg.takeIdleLocked(func(ic idleConn) bool { return ic.since.Before(cutoff) })...)
	r.mu.Unlock()
	for _, oc := range old {
		oc.Close()
		m.IdleReclaims.Add(1)
	}
}

// takeIdleLocked removes the idle connections drop selects from the pool and returns them
// for the caller to close outside r.mu.
func (r *peerRDMA) takeIdleLocked(drop func(idleConn) bool) []*onesided.Client {
	var out []*onesided.Client
	r.idle, out = takeIdle(r.idle, r.all, drop)
	return out
}

// takeIdle splits idle into the connections drop keeps and those it selects, which it
// also removes from all (the pool's or the SG lane's).
func takeIdle(idle []idleConn, all map[*onesided.Client]string, drop func(idleConn) bool) (keep []idleConn, out []*onesided.Client) {
	keep = idle[:0]
	for _, ic := range idle {
		if drop(ic) {
			out = append(out, ic.oc)
			delete(all, ic.oc)
		} else {
			keep = append(keep, ic)
		}
	}
	clear(idle[len(keep):])
	return keep, out
}

func (r *peerRDMA) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for oc := range r.all {
		oc.Close()
	}
	r.all, r.idle = nil, nil
	r.sg.closeLocked()
}

func (c *Client) rdmaIdleTimeout() time.Duration {
	if d := c.opts.RDMA.IdleTimeout; d > 0 {
		return d
	}
	return time.Minute
}

// startJanitor runs the idle reclaim of this client's RDMA pools (once, from the first RDMA
// connection); stopRDMA ends and joins it.
func (c *Client) startJanitor() {
	s := &c.rdma
	s.janitorOnce.Do(func() {
		s.stopJanitor, s.janitorDone = make(chan struct{}), make(chan struct{})
		idle := c.rdmaIdleTimeout()
		go func() {
			defer close(s.janitorDone)
			t := time.NewTicker(max(idle/4, time.Millisecond))
			defer t.Stop()
			for {
				select {
				case <-s.stopJanitor:
					return
				case now := <-t.C:
					c.mu.RLock()
					peers := make([]*peer, 0, len(c.peers))
					for _, p := range c.peers {
						peers = append(peers, p)
					}
					c.mu.RUnlock()
					for _, p := range peers {
						p.rdma.reclaim(now.Add(-idle), &s.m)
					}
				}
			}
		}()
	})
}

// stopRDMA stops the idle reclaim (Close).
func (c *Client) stopRDMA() {
	s := &c.rdma
	s.janitorOnce.Do(func() {}) // none started: none will be
	c.stopProbes()
	if s.stopJanitor != nil {
		close(s.stopJanitor)
		<-s.janitorDone
	}
}

func (c *Client) rdmaProvider() (verbs.Provider, error) {
	s := &c.rdma
	s.once.Do(func() {
		switch c.opts.RDMA.Provider {
		case "", "ibverbs":
			s.prov = ibverbs.New(ibverbs.Options{})
		case "soft":
			// One soft NIC per softN named, or SoftDevices when more (none: one).
			n := 0
			for _, d := range append([]string{c.opts.RDMA.Device}, c.opts.RDMA.Devices...) {
				if i, err := strconv.Atoi(strings.TrimPrefix(d, "soft")); err == nil && strings.HasPrefix(d, "soft") && i >= 0 && i < soft.MaxDevices {
					n = max(n, i+1)
				}
			}
			s.prov, s.provErr = soft.New(soft.Options{Devices: max(n, c.opts.RDMA.SoftDevices, len(c.opts.RDMA.SoftNUMANodes)),
				FaultFile: c.opts.RDMA.SoftFaultFile, NUMANodes: c.opts.RDMA.SoftNUMANodes})
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

// RegisterMemory registers buf for RDMA once per device (not per connection), now and for a
// device opened later, so PUT sources and GET destinations inside it move without staging
// copies on every RDMA connection. Without RDMA it only records the range (for
// UnregisterMemory). Registering the same range again is a no-op. The memory must stay
// valid until UnregisterMemory or Close.
func (c *Client) RegisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("dfkv: register memory: empty range: %w", ErrInvalid)
	}
	s := &c.rdma
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || c.closed.Load() {
		return ErrClosed
	}
	if regionIndex(s.regions, buf) >= 0 {
		return nil
	}
	for name, dev := range s.devs {
		if err := dev.RegisterMemory(buf); err != nil {
			for n2, d2 := range s.devs { // undo: all devices or none
				if n2 != name {
					_ = d2.UnregisterMemory(context.Background(), buf)
				}
			}
			return fmt.Errorf("dfkv: register memory on %q: %w", name, err)
		}
	}
	s.regions = append(s.regions, buf)
	return nil
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
	s := &c.rdma
	s.mu.Lock()
	i := regionIndex(s.regions, buf)
	if i < 0 {
		s.mu.Unlock()
		return fmt.Errorf("dfkv: unregister memory: %d bytes at %p were not registered: %w", len(buf), &buf[0], ErrInvalid)
	}
	s.regions = append(s.regions[:i], s.regions[i+1:]...)
	devs := make([]*onesided.Device, 0, len(s.devs))
	for _, d := range s.devs {
		devs = append(devs, d)
	}
	s.mu.Unlock()
	// Every op ends within the I/O timeout (its window's deadline), so this wait is bounded.
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.opts.IOTimeout)
	defer cancel()
	var first error
	for _, dev := range devs {
		err := dev.UnregisterMemory(ctx, buf)
		switch {
		case err == nil, errors.Is(err, onesided.ErrNotRegistered):
			// Not on the device: it was opened after a failed registration, or closed.
		case errors.Is(err, onesided.ErrPoolBusy):
			if first == nil {
				first = fmt.Errorf("dfkv: unregister memory: %w: %w", ErrBusy, err)
			}
		default:
			if first == nil {
				first = fmt.Errorf("dfkv: unregister memory: %w", err)
			}
		}
	}
	if first != nil && errors.Is(first, ErrBusy) {
		// Still registered somewhere: keep the range so a later call retries (a device that
		// let go answers ErrNotRegistered then, which is fine).
		s.mu.Lock()
		s.regions = append(s.regions, buf)
		s.mu.Unlock()
	}
	return first
}

// regionIndex finds the registered range equal to buf, or -1.
func regionIndex(regions [][]byte, buf []byte) int {
	for i, r := range regions {
		if &r[0] == &buf[0] && len(r) == len(buf) {
			return i
		}
	}
	return -1
}

// rdmaDevice returns the client's opened device for rail ("" = RDMAOptions.Device), opening
// it (and registering the pools on it) for its first connection.
func (c *Client) rdmaDevice(prov verbs.Provider, rail string) (*onesided.Device, error) {
	s := &c.rdma
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if d := s.devs[rail]; d != nil {
		return d, nil
	}
	name := rail
	if name == "" {
		name = c.opts.RDMA.Device
	}
	dev, err := onesided.OpenDevice(prov, name, &s.m)
	if err != nil {
		return nil, err
	}
	for _, b := range s.regions {
		if err := dev.RegisterMemory(b); err != nil {
			dev.Release()
			return nil, fmt.Errorf("register memory: %w", err)
		}
	}
	if s.devs == nil {
		s.devs = map[string]*onesided.Device{}
	}
	s.devs[rail] = dev
	return dev, nil
}

// closeRDMADevice drops the client's reference on its device (Close, after the
// connections): the last reference deregisters the pools, then frees the PD and context.
func (c *Client) closeRDMADevice() {
	s := &c.rdma
	s.mu.Lock()
	devs := s.devs
	s.devs, s.closed = nil, true
	s.mu.Unlock()
	for _, dev := range devs {
		dev.Release()
	}
}

// bufConn reads through the pooled connection's buffered reader.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// rdmaConn returns an idle or new RDMA connection to p and its rail, or nil when p is
// served over TCP (err is ErrNoCompatibleRail when that is why: client-local).
func (c *Client) rdmaConn(ctx context.Context, p *peer) (*onesided.Client, string, error) {
	if c.opts.RDMA == nil {
		return nil, "", nil
	}
	// A dial that fails on its rail before anything was submitted quarantines that rail;
	// the op then tries the next candidate (any op may cross rails then: nothing was sent).
	for range len(c.rdma.rc.devices) {
		oc, rail, err := c.rdmaConnOnce(ctx, p)
		if oc != nil || err != nil || rail == "" || !p.rdma.quarantined(rail, time.Now()) || ctx.Err() != nil {
			return oc, rail, err
		}
	}
	return c.rdmaConnOnce(ctx, p)
}

func (c *Client) rdmaConnOnce(ctx context.Context, p *peer) (*onesided.Client, string, error) {
	o := c.opts.RDMA
	r := &p.rdma
	r.mu.Lock()
	if r.refusal.active(time.Now()) || r.closed {
		r.mu.Unlock()
		return nil, "", nil
	}
	r.mu.Unlock()
	rail, err := c.acquireRail(ctx, p) // a rail and one of its credits (none without a whitelist)
	if err != nil {
		if errors.Is(err, ErrNoCompatibleRail) {
			c.rdma.rm.noRail.Inc()
			c.setTCPReason(fmt.Sprintf("server %s: %v", p.addr, err))
		}
		return nil, "", err
	}
	var oc *onesided.Client
	defer func() {
		if oc == nil {
			c.releaseRail(p, rail)
		}
	}()
	r.mu.Lock()
	// A connection whose server said it is going away (native drain notice) or whose
	// bootstrap connection ended (the server closed the session) is not reused.
	drained := r.takeIdleLocked(func(ic idleConn) bool { return ic.oc.Draining() || ic.oc.PeerClosed() })
	defer func() {
		for _, oc := range drained {
			oc.Close()
		}
	}()
	for i := len(r.idle) - 1; i >= 0; i-- {
		if r.idle[i].rail != rail {
			continue
		}
		oc = r.idle[i].oc
		r.idle = slices.Delete(r.idle, i, i+1)
		r.mu.Unlock()
		return oc, rail, nil
	}
	maxConns := o.MaxConns
	if maxConns <= 0 {
		maxConns = c.opts.PoolSize
	}
	if rail == "" && len(r.all)+r.dialing >= maxConns {
		r.mu.Unlock()
		c.rdma.m.PoolFull.Add(1)
		return nil, "", nil // every RDMA connection to p is busy: this op goes over TCP
	}
	r.dialing++
	v1 := r.v1 || o.ForceV1
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.dialing--
		r.mu.Unlock()
	}()
	oc = c.rdmaDial(ctx, p, rail, v1)
	if oc == nil && !v1 && p.rdma.speaksV1() {
		// The server answered v1: never change protocol on that QP; open a fresh connection
		// offering v1.
		oc = c.rdmaDial(ctx, p, rail, true)
	}
	return oc, rail, nil
}

// pickRail chooses the rail for p's next connection (docs/RDMA.md §4, "Client rail
// selection"): "" without a whitelist; else the primary when it is in the highest usable
// tier, else round robin over that tier.
func (c *Client) pickRail(p *peer) (string, error) {
	if len(c.rdma.rc.devices) == 0 {
		return "", nil
	}
	order, err := c.railOrder(p)
	if err != nil {
		return "", err
	}
	return order[0], nil
}

// rdmaPut returns oc to p's pool (or closes it past the pool's size).
func (c *Client) rdmaPut(p *peer, oc *onesided.Client, rail string) {
	c.releaseRail(p, rail)
	p.rdma.mu.Lock()
	if !p.rdma.closed && len(p.rdma.idle) < c.opts.PoolSize && !oc.Draining() {
		p.rdma.idle = append(p.rdma.idle, idleConn{oc: oc, rail: rail, since: time.Now()})
		oc = nil
	} else {
		delete(p.rdma.all, oc)
	}
	p.rdma.mu.Unlock()
	if oc != nil {
		oc.Close()
	}
}

// rdmaDrop closes a broken connection of p's pool.
func (c *Client) rdmaDrop(p *peer, oc *onesided.Client) {
	p.rdma.mu.Lock()
	rail, ok := p.rdma.all[oc]
	delete(p.rdma.all, oc)
	p.rdma.mu.Unlock()
	if ok {
		c.releaseRail(p, rail)
	}
	oc.Close()
}

func (r *peerRDMA) speaksV1() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v1
}

// rdmaDial bootstraps one RDMA connection to p on rail offering v1 or v2, or returns nil
// (TCP).
func (c *Client) rdmaDial(ctx context.Context, p *peer, rail string, v1 bool) *onesided.Client {
	return c.rdmaDialLane(ctx, p, rail, v1, false)
}

// rdmaDialLane is rdmaDial for the scalar pool or (sg) the SG lane: depth 1, kept apart.
func (c *Client) rdmaDialLane(ctx context.Context, p *peer, rail string, v1, sg bool) *onesided.Client {
	o, r := c.opts.RDMA, &p.rdma
	depth := c.rdmaDepth()
	if sg {
		depth = 1
	}
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
	// A caller that gives up (a context ending, Close stopping a rail probe) interrupts the
	// bootstrap by closing its connection; a connection closed that way is never pooled.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
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
	dev, err := c.rdmaDevice(prov, rail)
	if err != nil {
		pc.nc.Close()
		switch {
		case errors.Is(err, ErrClosed):
		case rail != "": // this rail's local device will not open: avoid it for a while
			c.quarantineRail(p, rail)
			c.setTCPReason(err.Error())
		default: // no device, or a pool that will not register: TCP
			c.markTCP(p, err.Error())
		}
		return nil
	}
	oc, err := onesided.Dial(bufConn{Conn: nc, r: pc.br}, onesided.Config{Provider: prov, Device: dev.Name(), Shared: dev,
		Depth: depth, MaxBlock: c.rdmaBlock(), IOTimeout: c.opts.IOTimeout, Logger: c.opts.Logger, Metrics: &c.rdma.m,
		ForceV1: v1, MRCacheBytes: o.MRCacheBytes, GID: o.gidPolicy(),
		Notify: onesided.NotifyConfig{Enabled: o.Notify, OOBFallback: o.NotifyOOBFallback, Handler: c.railNotice(p)}})
	if !stop() { // the context ended during the bootstrap: not the rail's nor the server's fault
		if err == nil {
			oc.Close()
		}
		return nil
	}
	switch {
	case err == nil:
	case errors.Is(err, dcp.ErrFallbackV1):
		r.mu.Lock()
		r.v1 = true
		r.mu.Unlock()
		c.setTCPReason(fmt.Sprintf("server %s answers RDMA v1", p.addr))
		return nil
	case rail != "" && (errors.Is(err, verbs.ErrNoDevice) || errors.Is(err, verbs.ErrUnavailable)):
		c.quarantineRail(p, rail) // this rail failed; others may not
		c.setTCPReason(err.Error())
		return nil
	case errors.Is(err, onesided.ErrBusy): // the server's segment is exhausted right now: this op goes over TCP
		c.setTCPReason(err.Error())
		return nil
	case rail != "": // a failed handshake on one rail: avoid that rail (probed back), not the server
		c.quarantineRail(p, rail)
		c.setTCPReason(err.Error())
		return nil
	default:
		// No device here, a tail refused either way, a failed handshake (an RTR that
		// cannot reach the peer, an answer that never came): the next op would fail the
		// same way, so the server stays on TCP for a backoff.
		c.markTCP(p, err.Error())
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		oc.Close()
		return nil
	}
	r.refusal.ok()
	switch {
	case sg:
		if r.sg.all == nil {
			r.sg.all = map[*onesided.Client]string{}
		}
		r.sg.all[oc] = rail
	default:
		if r.all == nil {
			r.all = map[*onesided.Client]string{}
		}
		r.all[oc] = rail
	}
	c.rdma.used.Store(true)
	c.rdma.rm.conns.WithLabelValues(rail).Inc()
	c.startJanitor()
	return oc
}

// quarantineRail avoids rail towards p for RDMAOptions.RailQuarantine.
func (c *Client) quarantineRail(p *peer, rail string) {
	d := c.opts.RDMA.RailQuarantine
	if d <= 0 {
		d = defaultRailQuarantine
	}
	if p.rdma.quarantine(rail, d) {
		c.rdma.rm.quarantines.WithLabelValues(rail).Inc()
		c.opts.Logger.Warn("dfkv: rdma rail quarantined for a server", "server", p.addr, "rail", rail, "for", d)
	}
	c.startProbe(p, rail)
}

// railNotice handles a server's dfkv.rail notifications: a rail of this client's that the
// server says is no longer healthy is quarantined towards it at once, before an op fails
// on it (the membership's topology says the same a poll later). Recovery stays the
// probe's, which checks the published health and a fresh connection.
func (c *Client) railNotice(p *peer) func(name string, body []byte) {
	return func(name string, body []byte) {
		if name != onesided.NotifyRail {
			return
		}
		dev, health, _, err := onesided.ParseRailEvent(body)
		if err != nil {
			c.opts.Logger.Debug("dfkv: rdma notification ignored", "server", p.addr, "err", err)
			return
		}
		if _, mine := c.rdma.rc.tier[dev]; !mine || health == fb.RailHealthHealthy.String() {
			return
		}
		go c.quarantineRail(p, dev) // the handler runs on the notification poller: never block it
	}
}

// markTCP keeps p on TCP for its refusal backoff (refusalBackoff), saying why in
// TransportMode and one log line per refusal.
func (c *Client) markTCP(p *peer, why string) {
	o := c.opts.RDMA
	p.rdma.mu.Lock()
	d := p.rdma.refusal.fail(time.Now(), o.RefusalBackoff, o.RefusalBackoffMax)
	n := p.rdma.refusal.n
	p.rdma.mu.Unlock()
	c.opts.Logger.Info("dfkv: rdma not in use for a server; using TCP", "server", p.addr, "reason", why, "retry_in", d, "refusals", n)
	c.setTCPReason(fmt.Sprintf("%s; TCP for %v, refusal %d", why, d, n))
}

// rdmaExec runs op over RDMA when p is served that way; handled is false for TCP peers.
func (c *Client) rdmaExec(ctx context.Context, p *peer, op *onesided.Op) (handled bool, err error) {
	if c.opts.RDMA != nil && op.MultiSGE() && !sgLaneOff.Load() {
		return c.sgExec(ctx, p, op)
	}
	return c.rdmaDo(ctx, p, []*onesided.Op{op})
}

// rdmaDo runs ops as one window on one RDMA connection to p (up to the negotiated depth in
// flight, replies in order); handled is false when p is served over TCP. On a broken
// connection its rail is quarantined towards p and the unfinished ops that may run again
// (splitReplay: reads, and writes known not to have been submitted) are replayed on
// another usable rail (completed ones keep their bytes); a write that may have been
// submitted keeps Status Unavailable and err says why. Every wait inside is bounded by
// the I/O timeout (one deadline for the whole call, replays included) and by ctx. With a
// rail whitelist, an op that finds its tier's rails out of credits waits (acquireRail) and
// fails with ErrTimeout when the wait runs out: it never spills to a lower tier or to TCP.
func (c *Client) rdmaDo(ctx context.Context, p *peer, ops []*onesided.Op) (handled bool, err error) {
	oc, rail, cerr := c.rdmaConn(ctx, p)
	if oc == nil {
		if cerr != nil && !errors.Is(cerr, ErrNoCompatibleRail) {
			for _, o := range ops { // credits never came: nothing was submitted
				o.Status = fb.StatusUnavailable
			}
			return true, cerr
		}
		return false, nil
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.IOTimeout)
	defer cancel()
	pending := ops
	var ambErr error // set when some write may have been submitted on a rail that broke
	for {
		stale0 := oc.StaleDropped()
		t0 := time.Now()
		derr := oc.Do(dctx, pending)
		c.railAccount(rail, oc, pending, stale0, derr)
		if derr == nil {
			c.railLatencyObserve(p, rail, time.Since(t0), len(pending))
			c.rdma.rm.ops.WithLabelValues(rail).Add(float64(len(pending)))
			p.markHealthy()
			c.rdmaPut(p, oc, rail)
			return true, ambErr
		}
		c.rdmaDrop(p, oc)
		if cerr := ctx.Err(); cerr != nil {
			return true, ctxErr(p.addr, cerr) // the caller's context ended: not the peer's fault
		}
		var rest []*onesided.Op
		for _, o := range pending {
			if o.Status == fb.StatusUnavailable {
				rest = append(rest, o)
			}
		}
		c.rdma.rm.ops.WithLabelValues(rail).Add(float64(len(pending) - len(rest)))
		if dctx.Err() == nil && rail != "" {
			c.quarantineRail(p, rail)
			replay, amb := splitReplay(rest)
			c.rdma.rm.ambiguous.WithLabelValues(rail).Add(float64(amb))
			if len(replay) > 0 {
				if noc, nrail, _ := c.rdmaConn(dctx, p); noc != nil && nrail != rail {
					if amb > 0 {
						ambErr = ioErr(p.addr, derr)
					}
					c.rdma.rm.replays.WithLabelValues(nrail).Add(float64(len(replay)))
					c.opts.Logger.Info("dfkv: rdma rail broke; replaying unfinished work on another rail",
						"server", p.addr, "from", rail, "to", nrail, "ops", len(replay), "ambiguous", amb, "err", derr)
					oc, rail, pending = noc, nrail, replay
					continue
				} else if noc != nil {
					c.rdmaPut(p, noc, nrail)
				}
			}
			if _, perr := c.pickRail(p); perr == nil {
				// Another rail of p is still usable: the rail failed, not (known) the peer.
				return true, ioErr(p.addr, derr)
			}
		}
		p.markFailed()
		return true, ioErr(p.addr, derr)
	}
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
			o.Dst = it.segs(true)
		}
		ops, its = append(ops, o), append(its, it)
	}
	if len(ops) == 0 {
		return rest
	}
	done, unsent, err := c.rdmaRun(ctx, ch.p, ops)
	if !done {
		return ch.items
	}
	for i, o := range ops {
		it := its[i]
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
