package railset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Peer is one server's RDMA connection pool, SG lane and rail state.
type Peer struct {
	s    *Set
	h    Host
	addr string

	mu      sync.Mutex
	refusal refusalBackoff              // the server refused RDMA: stay on TCP for a while
	busyAt  time.Time                   // the last refusal for want of segment room (ErrBusy)
	v1      bool                        // the server answers v1: offer v1 from the start
	idle    []idleConn                  // most recently used last
	all     map[*onesided.Client]string // every open connection and its rail
	quar    map[string]time.Time        // rail -> quarantined towards this server until
	rr      uint32                      // round robin over the chosen tier's rails
	dialing int                         // bootstraps in progress (count against MaxConns)
	sg      sgLane                      // multi-SGE requests' own connections (sglane.go)
	closed  bool
	px      railPeerState // credits, probers (credits.go, probe.go)
}

// NewPeer returns the pool towards the server h stands for.
func (s *Set) NewPeer(h Host) *Peer {
	p := &Peer{s: s, h: h, addr: h.Addr()}
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	p.closed = s.peersClosed
	s.peers = append(s.peers, p)
	return p
}

type idleConn struct {
	oc    *onesided.Client
	rail  string
	since time.Time
}

// reclaim closes the idle connections unused since before cutoff.
func (r *Peer) reclaim(cutoff time.Time, m *onesided.Metrics) {
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
func (r *Peer) takeIdleLocked(drop func(idleConn) bool) []*onesided.Client {
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

func (r *Peer) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for oc := range r.all {
		oc.Close()
	}
	r.all, r.idle = nil, nil
	r.sg.closeLocked()
}

// conn returns an idle or new RDMA connection to p and its rail, or nil when p is served
// over TCP (err is ErrNoCompatibleRail when that is why: client-local).
func (p *Peer) conn(ctx context.Context) (*onesided.Client, string, error) {
	oc, rail, err := p.connTry(ctx)
	if errors.Is(err, errPoolFull) {
		return nil, "", nil
	}
	return oc, rail, err
}

// errPoolFull: every RDMA connection to the peer is busy (MaxConns). An ordinary op then
// goes over TCP; a direct load (device memory) waits for one (connWait).
var errPoolFull = errors.New("railset: every RDMA connection to the server is busy")

// connWait is conn for ops that only RDMA may serve: a full pool is waited out (polled,
// bounded by ctx and the I/O timeout), never left to TCP.
func (p *Peer) connWait(ctx context.Context) (*onesided.Client, string, error) {
	deadline := time.Now().Add(p.s.o.IOTimeout)
	pause := 100 * time.Microsecond
	for {
		oc, rail, err := p.connTry(ctx)
		if !errors.Is(err, errPoolFull) {
			return oc, rail, err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, "", fmt.Errorf("%w: no RDMA connection to %s became free: %w", p.s.o.Errors.Timeout, p.addr, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 5*time.Millisecond)
	}
}

func (p *Peer) connTry(ctx context.Context) (*onesided.Client, string, error) {
	// A dial that fails on its rail before anything was submitted quarantines that rail;
	// the op then tries the next candidate (any op may cross rails then: nothing was sent).
	for range len(p.s.rc.devices) {
		oc, rail, err := p.connOnce(ctx)
		if oc != nil || err != nil || rail == "" || !p.quarantined(rail, time.Now()) || ctx.Err() != nil {
			return oc, rail, err
		}
	}
	return p.connOnce(ctx)
}

func (p *Peer) connOnce(ctx context.Context) (*onesided.Client, string, error) {
	s, o, r := p.s, &p.s.o, p
	r.mu.Lock()
	if r.refusal.active(time.Now()) || r.closed {
		r.mu.Unlock()
		return nil, "", nil
	}
	r.mu.Unlock()
	rail, err := p.acquireRail(ctx) // a rail and one of its credits (none without a whitelist)
	if err != nil {
		if errors.Is(err, ErrNoCompatibleRail) {
			s.rm.noRail.Inc()
			s.setTCPReason(fmt.Sprintf("server %s: %v", p.addr, err))
		}
		return nil, "", err
	}
	var oc *onesided.Client
	defer func() {
		if oc == nil {
			p.releaseRail(rail)
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
		maxConns = o.PoolSize
	}
	if rail == "" && len(r.all)+r.dialing >= maxConns {
		r.mu.Unlock()
		s.m.PoolFull.Add(1)
		return nil, "", errPoolFull // every RDMA connection to p is busy: this op goes over TCP
	}
	r.dialing++
	v1 := r.v1 || o.ForceV1
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.dialing--
		r.mu.Unlock()
	}()
	t0 := time.Now()
	oc = p.dial(ctx, rail, v1)
	if oc == nil && !v1 && p.speaksV1() {
		// The server answered v1: never change protocol on that QP; open a fresh connection
		// offering v1.
		oc = p.dial(ctx, rail, true)
	}
	if oc == nil {
		r.mu.Lock()
		busy := !r.busyAt.Before(t0) && len(r.all) > 0
		r.mu.Unlock()
		if busy { // no room for another connection now, but p has some: one will be free
			return nil, "", errPoolFull
		}
	}
	return oc, rail, nil
}

// pickRail chooses the rail for p's next connection (docs/RDMA.md §4, "Client rail
// selection"): "" without a whitelist; else the primary when it is in the highest usable
// tier, else round robin over that tier.
func (p *Peer) pickRail() (string, error) {
	if len(p.s.rc.devices) == 0 {
		return "", nil
	}
	order, err := p.railOrder()
	if err != nil {
		return "", err
	}
	return order[0], nil
}

// put returns oc to p's pool (or closes it past the pool's size).
func (p *Peer) put(oc *onesided.Client, rail string) {
	p.releaseRail(rail)
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.s.o.PoolSize && !oc.Draining() {
		p.idle = append(p.idle, idleConn{oc: oc, rail: rail, since: time.Now()})
		oc = nil
	} else {
		delete(p.all, oc)
	}
	p.mu.Unlock()
	if oc != nil {
		oc.Close()
	}
}

// drop closes a broken connection of p's pool.
func (p *Peer) drop(oc *onesided.Client) {
	p.mu.Lock()
	rail, ok := p.all[oc]
	delete(p.all, oc)
	p.mu.Unlock()
	if ok {
		p.releaseRail(rail)
	}
	oc.Close()
}

func (r *Peer) speaksV1() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v1
}

// dial bootstraps one RDMA connection to p on rail offering v1 or v2, or returns nil
// (TCP).
func (p *Peer) dial(ctx context.Context, rail string, v1 bool) *onesided.Client {
	return p.dialLane(ctx, rail, v1, false)
}

// dialLane is dial for the scalar pool or (sg) the SG lane: depth 1, kept apart.
func (p *Peer) dialLane(ctx context.Context, rail string, v1, sg bool) *onesided.Client {
	s, r := p.s, p
	o := &s.o
	depth := s.depth()
	if sg {
		depth = 1
	}
	prov, err := s.provider()
	if err != nil {
		s.setTCPReason(err.Error())
		return nil
	}
	nc, err := p.h.Bootstrap(ctx)
	switch {
	case errors.Is(err, ErrNoNetConn):
		s.setTCPReason(ErrNoNetConn.Error())
		return nil
	case errors.Is(err, ErrNotServed):
		p.markTCP(fmt.Sprintf("server %s does not serve RDMA", p.addr))
		return nil
	case err != nil:
		return nil // the TCP path reports the failure
	}
	// A caller that gives up (a context ending, Close stopping a rail probe) interrupts the
	// bootstrap by closing its connection; a connection closed that way is never pooled.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	dev, err := s.device(prov, rail)
	if err != nil {
		nc.Close()
		switch {
		case errors.Is(err, o.Errors.Closed):
		case rail != "": // this rail's local device will not open: avoid it for a while
			p.quarantineRail(rail)
			s.setTCPReason(err.Error())
		default: // no device, or a pool that will not register: TCP
			p.markTCP(err.Error())
		}
		return nil
	}
	oc, err := onesided.Dial(nc, onesided.Config{Provider: prov, Device: dev.Name(), Shared: dev,
		Depth: depth, MaxBlock: s.MaxBlock(), IOTimeout: o.IOTimeout, Logger: o.Logger, Metrics: &s.m,
		ForceV1: v1, MRCacheBytes: o.MRCacheBytes, GID: o.GID,
		Notify: onesided.NotifyConfig{Enabled: o.Notify, OOBFallback: o.NotifyOOBFallback, Handler: p.railNotice()}})
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
		s.setTCPReason(fmt.Sprintf("server %s answers RDMA v1", p.addr))
		return nil
	case rail != "" && (errors.Is(err, verbs.ErrNoDevice) || errors.Is(err, verbs.ErrUnavailable)):
		p.quarantineRail(rail) // this rail failed; others may not
		s.setTCPReason(err.Error())
		return nil
	case errors.Is(err, onesided.ErrBusy): // the server's segment is exhausted right now: this op goes over TCP
		s.setTCPReason(err.Error())
		r.mu.Lock()
		r.busyAt = time.Now()
		r.mu.Unlock()
		return nil
	case rail != "": // a failed handshake on one rail: avoid that rail (probed back), not the server
		p.quarantineRail(rail)
		s.setTCPReason(err.Error())
		return nil
	default:
		// No device here, a tail refused either way, a failed handshake (an RTR that
		// cannot reach the peer, an answer that never came): the next op would fail the
		// same way, so the server stays on TCP for a backoff.
		p.markTCP(err.Error())
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
	s.used.Store(true)
	s.rm.conns.WithLabelValues(rail).Inc()
	s.startJanitor()
	return oc
}

// quarantineRail avoids rail towards p for Options.RailQuarantine.
func (p *Peer) quarantineRail(rail string) {
	s := p.s
	d := s.o.RailQuarantine
	if d <= 0 {
		d = defaultRailQuarantine
	}
	if p.quarantine(rail, d) {
		s.rm.quarantines.WithLabelValues(rail).Inc()
		s.o.Logger.Warn("dfkv: rdma rail quarantined for a server", "server", p.addr, "rail", rail, "for", d)
	}
	p.startProbe(rail)
}

// railNotice handles a server's dfkv.rail notifications: a rail of this client's that the
// server says is no longer healthy is quarantined towards it at once, before an op fails
// on it (the membership's topology says the same a poll later). Recovery stays the
// probe's, which checks the published health and a fresh connection.
func (p *Peer) railNotice() func(name string, body []byte) {
	return func(name string, body []byte) {
		if name != onesided.NotifyRail {
			return
		}
		dev, health, _, err := onesided.ParseRailEvent(body)
		if err != nil {
			p.s.o.Logger.Debug("dfkv: rdma notification ignored", "server", p.addr, "err", err)
			return
		}
		if _, mine := p.s.rc.tier[dev]; !mine || health == fb.RailHealthHealthy.String() {
			return
		}
		go p.quarantineRail(dev) // the handler runs on the notification poller: never block it
	}
}

// markTCP keeps p on TCP for its refusal backoff (refusalBackoff), saying why in Mode and
// one log line per refusal.
func (p *Peer) markTCP(why string) {
	o := &p.s.o
	p.mu.Lock()
	d := p.refusal.fail(time.Now(), o.RefusalBackoff, o.RefusalBackoffMax)
	n := p.refusal.n
	p.mu.Unlock()
	o.Logger.Info("dfkv: rdma not in use for a server; using TCP", "server", p.addr, "reason", why, "retry_in", d, "refusals", n)
	p.s.setTCPReason(fmt.Sprintf("%s; TCP for %v, refusal %d", why, d, n))
}

// quarantined reports whether rail is quarantined towards this peer now.
func (r *Peer) quarantined(rail string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.quar[rail]
	return ok && now.Before(t)
}

// quarantine avoids rail towards this peer for d and closes its idle connections there;
// it reports whether the rail was not quarantined before (a new quarantine, counted).
func (r *Peer) quarantine(rail string, d time.Duration) bool {
	now := time.Now()
	r.mu.Lock()
	if r.quar == nil {
		r.quar = map[string]time.Time{}
	}
	until, was := r.quar[rail]
	fresh := !was || !now.Before(until)
	r.quar[rail] = now.Add(d)
	drop := r.takeIdleLocked(func(ic idleConn) bool { return ic.rail == rail })
	r.mu.Unlock()
	for _, oc := range drop {
		oc.Close()
	}
	return fresh
}
