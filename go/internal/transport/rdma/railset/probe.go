package railset

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
	lat     railLatency     // per-rail latency EWMAs (latency.go)
	probing map[string]bool // guarded by Peer.mu
}

func (s *Set) railProbeInterval() time.Duration {
	if d := s.o.RailProbeInterval; d != 0 {
		return d
	}
	return defaultRailProbeInterval
}

// startProbe starts rail's prober towards p unless one runs or probing is off.
func (p *Peer) startProbe(rail string) {
	every := p.s.railProbeInterval()
	if every < 0 || rail == "" {
		return
	}
	x := &p.s.rx
	x.probeMu.Lock()
	defer x.probeMu.Unlock()
	if x.stopped {
		return
	}
	if x.probeStop == nil {
		x.probeStop = make(chan struct{})
	}
	p.mu.Lock()
	if p.px.probing[rail] || p.closed {
		p.mu.Unlock()
		return
	}
	if p.px.probing == nil {
		p.px.probing = map[string]bool{}
	}
	p.px.probing[rail] = true
	p.mu.Unlock()
	x.probeWG.Add(1)
	go p.probeLoop(rail, every, x.probeStop)
}

func (p *Peer) probeLoop(rail string, every time.Duration, stop <-chan struct{}) {
	s := p.s
	defer s.rx.probeWG.Done()
	defer func() {
		p.mu.Lock()
		delete(p.px.probing, rail)
		p.mu.Unlock()
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !p.quarantined(rail, time.Now()) {
			return // the timer ended it (or another path did)
		}
		s.rm.probes.WithLabelValues(rail).Inc()
		if p.probeRail(rail, stop) {
			p.unquarantine(rail)
			s.rm.recoveries.WithLabelValues(rail).Inc()
			s.o.Logger.Info("dfkv: rdma rail recovered after a probe", "server", p.addr, "rail", rail)
			return
		}
	}
}

// probeRail runs one probe: published usable, a fresh connection on rail, one EXIST.
func (p *Peer) probeRail(rail string, stop <-chan struct{}) bool {
	s := p.s
	if !p.railPublishedUsable(rail) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.o.IOTimeout)
	defer cancel()
	go func() { // Close interrupts a probe in flight
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if !p.px.credits.tryTake(rail, s.railCreditBudget()) {
		return false
	}
	s.rm.credits.WithLabelValues(rail).Inc()
	p.mu.Lock()
	v1 := p.v1 || s.o.ForceV1
	p.mu.Unlock()
	oc := p.dial(ctx, rail, v1)
	if oc == nil {
		p.releaseRail(rail)
		return false
	}
	op := &onesided.Op{Kind: fb.OpExist, Tenant: s.o.Tenant, ID: identity.ObjectID{Hi: rand.Uint64(), Lo: rand.Uint64()}}
	err := oc.Do(ctx, []*onesided.Op{op})
	s.railAccount(rail, oc, nil, 0, err) // stale completions the fresh QP dropped, a completion error
	if err != nil {
		p.drop(oc)
		return false
	}
	p.put(oc, rail)
	return true
}

// railPublishedUsable: the server publishes rail usable (or publishes no rails).
func (p *Peer) railPublishedUsable(rail string) bool {
	if p.s.o.Published == nil {
		return true
	}
	published := p.s.o.Published(p.addr)
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
func (s *Set) stopProbes() {
	x := &s.rx
	x.probeMu.Lock()
	x.stopped = true
	if x.probeStop != nil {
		close(x.probeStop)
	}
	x.probeMu.Unlock()
	x.probeWG.Wait()
}

// unquarantine ends rail's quarantine towards this peer.
func (r *Peer) unquarantine(rail string) {
	r.mu.Lock()
	delete(r.quar, rail)
	r.mu.Unlock()
}
