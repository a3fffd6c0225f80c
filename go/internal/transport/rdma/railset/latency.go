package railset

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Per-rail latency (docs/RDMA.md §4, "Latency"). The client keeps, per server and rail, an
// EWMA of the seconds per completed op (each successful window's time divided by its op
// count: a scalar op is one sample of its own latency). Inside the tier health chose and
// after the primary/NUMA order, a rail whose EWMA is more than RailSlowFactor times the
// best rail of that tier (both with railLatencyMinSamples samples), and at least
// railSlowMinGap slower per op, is demoted: it moves
// to the end of the order, and every railSlowShare-th pick puts it first instead, so it
// keeps a small share of the traffic and its EWMA can come back down when it speeds up.
// Latency never removes a rail (a demoted rail still takes ops when the others are out
// of credits), never moves traffic to a lower tier, and never touches peer health. The
// primary rail (DFKV_RDMA_PRIMARY_DEV) is an explicit choice and is never demoted.

const (
	defaultRailSlowFactor = 4.0
	railLatencyAlpha      = 0.2 // weight of a new sample in the EWMA
	// railSlowMinGap: a rail is slow only when it is also this much slower per op than the
	// best; smaller gaps are scheduling noise (a GC pause, a busy core), not a slow rail.
	railSlowMinGap        = 500 * time.Microsecond
	railLatencyMinSamples = 8 // samples before a rail's EWMA counts (as the slow one or the best)
	railSlowShare         = 8 // a demoted rail is put first on every 8th pick
)

// railLat is one rail's latency towards one server.
type railLat struct {
	ewma    float64 // seconds per op
	n       int     // samples, capped at railLatencyMinSamples
	demoted bool
}

// railLatency is one server's per-rail latency state.
type railLatency struct {
	mu    sync.Mutex
	rails map[string]*railLat
	picks uint64 // orders made while some rail was demoted
}

// observe adds one window's seconds per op on rail.
func (l *railLatency) observe(rail string, perOp float64) {
	if rail == "" || !(perOp >= 0) || math.IsInf(perOp, 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rails == nil {
		l.rails = map[string]*railLat{}
	}
	st := l.rails[rail]
	if st == nil {
		st = &railLat{}
		l.rails[rail] = st
	}
	if st.n == 0 {
		st.ewma = perOp
	} else {
		st.ewma += railLatencyAlpha * (perOp - st.ewma)
	}
	st.n = min(st.n+1, railLatencyMinSamples)
}

// splitSlow splits order (one tier, in preference order) into the rails kept in place and
// the slow ones: a rail is slow when it and the tier's fastest rail both have enough
// samples and its EWMA exceeds factor times the fastest one's and the fastest one's plus
// railSlowMinGap; a rail already demoted stays slow until its EWMA is under halfway from
// the fastest one's to that limit. The primary is never slow (an explicit choice; it may be
// the best).
// factor <= 0: none is slow.
func splitSlow(order []string, stats map[string]*railLat, factor float64, primary string) (kept, slow []string) {
	if factor <= 0 || len(order) < 2 {
		return order, nil
	}
	best := math.Inf(1)
	for _, d := range order {
		if st := stats[d]; st != nil && st.n >= railLatencyMinSamples {
			best = min(best, st.ewma)
		}
	}
	if math.IsInf(best, 1) {
		return order, nil
	}
	limit := max(factor*best, best+railSlowMinGap.Seconds())
	// Hysteresis: a demoted rail stays demoted until it is under halfway between the best
	// and the limit, so that one hovering at the limit does not flap (and log) every pick.
	restore := best + (limit-best)/2
	for _, d := range order {
		if st := stats[d]; d != primary && st != nil && st.n >= railLatencyMinSamples &&
			(st.ewma > limit || (st.demoted && st.ewma > restore)) {
			slow = append(slow, d)
		} else {
			kept = append(kept, d)
		}
	}
	return kept, slow
}

// demoteSlowRails applies latency demotion to order (p's chosen tier in preference order)
// and counts demotions and restores per rail.
func (p *Peer) demoteSlowRails(order []string) []string {
	s := p.s
	factor := s.rc.slowFactor
	if factor <= 0 || len(order) < 2 {
		return order
	}
	l := &p.px.lat
	l.mu.Lock()
	kept, slow := splitSlow(order, l.rails, factor, s.rc.primary)
	var demoted, restored []string
	for _, d := range order {
		st := l.rails[d]
		if st == nil {
			continue
		}
		isSlow := slices.Contains(slow, d)
		switch {
		case isSlow && !st.demoted:
			demoted = append(demoted, d)
		case !isSlow && st.demoted:
			restored = append(restored, d)
		}
		st.demoted = isSlow
	}
	var share bool
	var k int
	if len(slow) > 0 {
		l.picks++
		share = l.picks%railSlowShare == 0
		k = int((l.picks / railSlowShare) % uint64(len(slow)))
	}
	l.mu.Unlock()
	for _, d := range demoted {
		s.rm.latDemotions.WithLabelValues(d).Inc()
		s.o.Logger.Info("dfkv: rdma rail slow towards a server; demoted inside its tier", "server", p.addr, "rail", d, "factor", factor)
	}
	for _, d := range restored {
		s.rm.latRestores.WithLabelValues(d).Inc()
		s.o.Logger.Info("dfkv: rdma rail no longer slow towards a server; demotion ended", "server", p.addr, "rail", d)
	}
	if len(slow) == 0 {
		return order
	}
	if share { // the demoted rails' small share: one of them first, round robin
		slow = append(append([]string(nil), slow[k:]...), slow[:k]...)
		return append(slow, kept...)
	}
	return append(kept, slow...)
}

// railLatencyObserve records a successful window of n ops on rail towards p that took d.
func (p *Peer) railLatencyObserve(rail string, d time.Duration, n int) {
	if n <= 0 {
		return
	}
	perOp := d.Seconds() / float64(n)
	p.s.rm.latency.WithLabelValues(rail).Observe(perOp)
	if p.s.rc.slowFactor > 0 {
		p.px.lat.observe(rail, perOp)
	}
}
