package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Active probing of quarantined rails (docs/RDMA.md §4, "Quarantine, probing and
// recovery"). A rail quarantined towards a server gets one prober goroutine: every
// RailProbeInterval it checks that the server publishes the rail usable, opens an RDMA
// connection on it (bootstrap, QP to RTS) and runs one EXIST of a random key on it, all
// under the I/O timeout. The first probe that completes ends the quarantine (a recovery,
// counted) and leaves its connection in the pool; a failed probe leaves the rail
// quarantined. The quarantine timer (RailQuarantine) still ends it at the latest; then
// the prober stops without counting a recovery.

const defaultRailProbeInterval = time.Second

// railState is the client-wide part of rail selection that is not the policy itself.
type railState struct {
	numaNode  int // the caller's node (NUMA), resolved in New
	nodesOnce sync.Once
	nodeOf    map[string]int

	probeMu   sync.Mutex
	probeStop chan struct{} // closed by stopProbes
	probeWG   sync.WaitGroup
	stopped   bool
}

// railPeerState is the per-server part: credits, latency and the rails being probed.
type railPeerState struct {
	credits railCredits
	lat     railLatency     // per-rail latency EWMAs (raillatency.go)
	probing map[string]bool // guarded by peerRDMA.mu
}

func (c *Client) railProbeInterval() time.Duration {
	if d := c.opts.RDMA.RailProbeInterval; d != 0 {
		return d
	}
	return defaultRailProbeInterval
}

// startProbe starts rail's prober towards p unless one runs or probing is off.
func (c *Client) startProbe(p *peer, rail string) {
	every := c.railProbeInterval()
	if every < 0 || rail == "" {
		return
	}
	x := &c.rdma.rx
	x.probeMu.Lock()
	defer x.probeMu.Unlock()
	if x.stopped {
		return
	}
	if x.probeStop == nil {
		x.probeStop = make(chan struct{})
	}
	p.rdma.mu.Lock()
	if p.rdma.px.probing[rail] || p.rdma.closed {
		p.rdma.mu.Unlock()
		return
	}
	if p.rdma.px.probing == nil {
		p.rdma.px.probing = map[string]bool{}
	}
	p.rdma.px.probing[rail] = true
	p.rdma.mu.Unlock()
	x.probeWG.Add(1)
	go c.probeLoop(p, rail, every, x.probeStop)
}

func (c *Client) probeLoop(p *peer, rail string, every time.Duration, stop <-chan struct{}) {
	defer c.rdma.rx.probeWG.Done()
	defer func() {
		p.rdma.mu.Lock()
		delete(p.rdma.px.probing, rail)
		p.rdma.mu.Unlock()
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !p.rdma.quarantined(rail, time.Now()) {
			return // the timer ended it (or another path did)
		}
		c.rdma.rm.probes.WithLabelValues(rail).Inc()
		if c.probeRail(p, rail, stop) {
			p.rdma.unquarantine(rail)
			c.rdma.rm.recoveries.WithLabelValues(rail).Inc()
			c.opts.Logger.Info("dfkv: rdma rail recovered after a probe", "server", p.addr, "rail", rail)
			return
		}
	}
}

// probeRail runs one probe: published usable, a fresh connection on rail, one EXIST.
func (c *Client) probeRail(p *peer, rail string, stop <-chan struct{}) bool {
	if !c.railPublishedUsable(p, rail) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.IOTimeout)
	defer cancel()
	go func() { // Close interrupts a probe in flight
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if !p.rdma.px.credits.tryTake(rail, c.railCreditBudget()) {
		return false
	}
	c.rdma.rm.credits.WithLabelValues(rail).Inc()
	r := &p.rdma
	r.mu.Lock()
	v1 := r.v1 || c.opts.RDMA.ForceV1
	r.mu.Unlock()
	oc := c.rdmaDial(ctx, p, rail, v1)
	if oc == nil {
		c.releaseRail(p, rail)
		return false
	}
	op := &onesided.Op{Kind: fb.OpExist, Tenant: c.tenant, ID: identity.ObjectID{Hi: rand.Uint64(), Lo: rand.Uint64()}}
	err := oc.Do(ctx, []*onesided.Op{op})
	c.railAccount(rail, oc, nil, 0, err) // stale completions the fresh QP dropped, a completion error
	if err != nil {
		c.rdmaDrop(p, oc)
		return false
	}
	c.rdmaPut(p, oc, rail)
	return true
}

// railPublishedUsable: the server publishes rail usable (or publishes no rails).
func (c *Client) railPublishedUsable(p *peer, rail string) bool {
	rp, ok := c.opts.Membership.(railPublisher)
	if !ok {
		return true
	}
	published, _ := rp.PublishedRails(p.addr)
	if len(published) == 0 {
		return true
	}
	for _, r := range published {
		if r.Device == rail {
			return r.Usable()
		}
	}
	return false
}

// stopProbes ends every prober and waits for them (Close).
func (c *Client) stopProbes() {
	x := &c.rdma.rx
	x.probeMu.Lock()
	x.stopped = true
	if x.probeStop != nil {
		close(x.probeStop)
	}
	x.probeMu.Unlock()
	x.probeWG.Wait()
}

// unquarantine ends rail's quarantine towards this peer.
func (r *peerRDMA) unquarantine(rail string) {
	r.mu.Lock()
	delete(r.quar, rail)
	r.mu.Unlock()
}
