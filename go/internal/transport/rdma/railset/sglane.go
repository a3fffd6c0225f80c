package railset

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// The SG lane (docs/RDMA.md, "SG lane"): multi-SGE requests (an op whose caller memory is
// more than one piece, typically device-direct pages gathered from registered ranges) never
// share a QP with another request in flight. NICs have been seen to overlap multi-SGE
// writes of distinct registered ranges on one QP and fail them with protection errors, so
// these requests get their own pool of connections per server, each negotiated at depth 1;
// a batch's SG requests still fan out over up to Options.Depth such connections at
// once, so the batch keeps its width while every QP carries one request (one registered
// range set) at a time.

// sgLaneOff routes multi-SGE requests through the scalar pool as before the lane existed
// (tests only: it shows the per-QP series would catch an overlap).
var sgLaneOff atomic.Bool

// SetSGLaneOff switches the SG lane off (every Set of the process) until restore is called.
// Tests only: with the lane off the per-QP series catch the overlap it prevents.
func SetSGLaneOff(off bool) (restore func()) {
	old := sgLaneOff.Swap(off)
	return func() { sgLaneOff.Store(old) }
}

// sgLane is one server's SG-lane connections; guarded by its Peer's mu.
type sgLane struct {
	idle    []idleConn                  // most recently used last
	all     map[*onesided.Client]string // every open lane connection and its rail
	dialing int                         // lane bootstraps in progress (count against the bound)
}

func (s *Set) sgLaneConns() int {
	n := 0
	for _, p := range s.peerList() {
		p.mu.Lock()
		n += len(p.sg.all)
		p.mu.Unlock()
	}
	return n
}

// sgLaneMax bounds one server's SG lane connections: Options.SGLaneConns, default the
// scalar pool's bound. A lane connection leases one receive slot, a scalar one Depth.
func (s *Set) sgLaneMax() int {
	if n := s.o.SGLaneConns; n > 0 {
		return n
	}
	if n := s.o.MaxConns; n > 0 {
		return n
	}
	return s.o.PoolSize
}

// takeIdleLocked removes the idle lane connections drop selects and returns them for the
// caller to close outside the peer's mu.
func (l *sgLane) takeIdleLocked(drop func(idleConn) bool) []*onesided.Client {
	var out []*onesided.Client
	l.idle, out = takeIdle(l.idle, l.all, drop)
	return out
}

// closeLocked closes every lane connection (the peer's pool is closing).
func (l *sgLane) closeLocked() {
	for oc := range l.all {
		oc.Close()
	}
	l.all, l.idle = nil, nil
}

// sgConn returns an idle or new SG lane connection to p and its rail, or nil (p is served
// over TCP, no rail is usable, or the lane is at its bound). Like conn, a dial that
// fails on its rail before anything was submitted tries the next candidate rail.
func (p *Peer) sgConn(ctx context.Context) (*onesided.Client, string) {
	for range len(p.s.rc.devices) {
		oc, rail, err := p.sgConnOnce(ctx)
		if oc != nil || err != nil || rail == "" || !p.quarantined(rail, time.Now()) || ctx.Err() != nil {
			return oc, rail
		}
	}
	oc, rail, _ := p.sgConnOnce(ctx)
	return oc, rail
}

func (p *Peer) sgConnOnce(ctx context.Context) (*onesided.Client, string, error) {
	s, r := p.s, p
	r.mu.Lock()
	if r.refusal.active(time.Now()) || r.closed {
		r.mu.Unlock()
		return nil, "", nil
	}
	r.mu.Unlock()
	rail, err := p.pickRail()
	if err != nil {
		s.rm.noRail.Inc()
		return nil, "", err
	}
	r.mu.Lock()
	for i := len(r.sg.idle) - 1; i >= 0; i-- {
		if r.sg.idle[i].rail == rail {
			oc := r.sg.idle[i].oc
			r.sg.idle = append(r.sg.idle[:i], r.sg.idle[i+1:]...)
			r.mu.Unlock()
			return oc, rail, nil
		}
	}
	if len(r.sg.all)+r.sg.dialing >= s.sgLaneMax() {
		r.mu.Unlock()
		s.sg.full.Inc()
		return nil, "", nil
	}
	r.sg.dialing++
	v1 := r.v1 || s.o.ForceV1
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.sg.dialing--
		r.mu.Unlock()
	}()
	oc := p.dialLane(ctx, rail, v1, true)
	if oc == nil && !v1 && r.speaksV1() {
		oc = p.dialLane(ctx, rail, true, true)
	}
	if oc != nil {
		s.sg.opened.Inc()
	}
	return oc, rail, nil
}

// sgPut returns a lane connection to p's lane (or closes it past the lane's bound).
func (p *Peer) sgPut(oc *onesided.Client, rail string) {
	r := p
	r.mu.Lock()
	if _, ok := r.sg.all[oc]; ok && !r.closed && len(r.sg.idle) < p.s.sgLaneMax() {
		r.sg.idle = append(r.sg.idle, idleConn{oc: oc, rail: rail, since: time.Now()})
		oc = nil
	} else {
		delete(r.sg.all, oc)
	}
	r.mu.Unlock()
	if oc != nil {
		oc.Close()
	}
}

// sgDrop closes a broken lane connection.
func (p *Peer) sgDrop(oc *onesided.Client) {
	p.mu.Lock()
	delete(p.sg.all, oc)
	p.mu.Unlock()
	oc.Close()
}

// Run runs one batch chunk's ops over RDMA: multi-SGE ops on the SG lane, the others as
// one window on a scalar connection, both at once. handled is false when nothing ran over
// RDMA (p is served over TCP); unsent are ops never submitted (the lane or the scalar pool
// was full, or p is on TCP), which the caller sends over TCP. err is for the ops left with
// Status Unavailable.
func (p *Peer) Run(ctx context.Context, ops []*onesided.Op) (handled bool, unsent map[*onesided.Op]bool, err error) {
	var scalar, sg []*onesided.Op
	for _, o := range ops {
		if o.MultiSGE() && !sgLaneOff.Load() {
			sg = append(sg, o)
		} else {
			scalar = append(scalar, o)
		}
	}
	if len(sg) == 0 {
		handled, err = p.do(ctx, ops)
		return handled, nil, err
	}
	var (
		wg         sync.WaitGroup
		sHandled   bool
		sErr       error
		laneUnsent map[*onesided.Op]bool
		laneErr    error
	)
	if len(scalar) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sHandled, sErr = p.do(ctx, scalar)
		}()
	}
	laneUnsent, laneErr = p.sgRun(ctx, sg)
	// What the lane could not take (at its bound, or the server refused another lease) runs
	// one request at a time on scalar connections: still one multi-SGE request per QP, and
	// still RDMA. Only what those cannot take either goes over TCP.
	for _, o := range sg {
		if !laneUnsent[o] {
			continue
		}
		h, e := p.do(ctx, []*onesided.Op{o})
		if !h {
			continue
		}
		delete(laneUnsent, o)
		if laneErr == nil {
			laneErr = e
		}
	}
	wg.Wait()
	unsent = laneUnsent
	if len(scalar) > 0 && !sHandled {
		for _, o := range scalar {
			unsent[o] = true
		}
	}
	if len(unsent) == len(ops) {
		return false, nil, nil
	}
	err = sErr
	if err == nil {
		err = laneErr
	}
	return true, unsent, err
}

// sgExec runs one multi-SGE op on the SG lane, else alone on a scalar connection (one
// request in flight there too); handled is false when it was not sent.
func (p *Peer) sgExec(ctx context.Context, op *onesided.Op) (handled bool, err error) {
	unsent, err := p.sgRun(ctx, []*onesided.Op{op})
	if unsent[op] {
		return p.do(ctx, []*onesided.Op{op})
	}
	return true, err
}

// sgRun runs multi-SGE ops on p's SG lane: up to Options.Depth lane connections at
// once, one request in flight on each. It returns the ops never submitted (no lane
// connection could be had for them: they may go over TCP, even PUTs) and the error of the
// ops left Unavailable. A broken lane connection quarantines its rail towards p; its GET or
// EXIST is replayed on a lane connection of another rail; a PUT or REMOVE that may have
// been submitted is not. Every wait is bounded by one I/O deadline for the whole call.
func (p *Peer) sgRun(ctx context.Context, ops []*onesided.Op) (unsent map[*onesided.Op]bool, err error) {
	s := p.s
	unsent = map[*onesided.Op]bool{}
	type laneConn struct {
		oc   *onesided.Client
		rail string
	}
	width := min(int(s.depth()), len(ops))
	var conns []laneConn
	for len(conns) < width {
		oc, rail := p.sgConn(ctx)
		if oc == nil {
			break
		}
		conns = append(conns, laneConn{oc, rail})
	}
	if len(conns) == 0 {
		for _, o := range ops {
			unsent[o] = true
		}
		return unsent, nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.o.IOTimeout)
	defer cancel()
	for _, o := range ops { // until its reply arrives an op reads Unavailable
		o.Status = fb.StatusUnavailable
	}
	var (
		next    atomic.Int64
		started = make([]bool, len(ops))
		mu      sync.Mutex
		first   error
		wg      sync.WaitGroup
	)
	fail := func(e error) {
		mu.Lock()
		if first == nil {
			first = e
		}
		mu.Unlock()
	}
	m := s.sg
	for _, lc := range conns {
		wg.Add(1)
		go func(oc *onesided.Client, rail string) {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ops) {
					break
				}
				started[i] = true
				op := ops[i]
				for {
					b := m.busy.Add(1)
					raiseMax(&m.busyMax, b)
					stale0 := oc.StaleDropped()
					t0 := time.Now()
					derr := oc.Do(dctx, []*onesided.Op{op})
					m.busy.Add(-1)
					s.railAccount(rail, oc, []*onesided.Op{op}, stale0, derr) // bytes, stale completions, a completion error
					if derr == nil {
						p.railLatencyObserve(rail, time.Since(t0), 1)
						s.rm.ops.WithLabelValues(rail).Inc()
						break
					}
					p.sgDrop(oc)
					oc = nil
					if cerr := ctx.Err(); cerr != nil {
						fail(s.o.Errors.Ctx(p.addr, cerr))
						return
					}
					if dctx.Err() == nil && rail != "" {
						p.quarantineRail(rail)
						if replay, _ := splitReplay([]*onesided.Op{op}); len(replay) == 1 { // a read, or a write never posted
							if noc, nrail := p.sgConn(dctx); noc != nil && nrail != rail {
								s.rm.replays.WithLabelValues(nrail).Inc()
								s.o.Logger.Info("dfkv: rdma rail broke; replaying an SG read on another rail",
									"server", p.addr, "from", rail, "to", nrail, "err", derr)
								oc, rail = noc, nrail
								continue
							} else if noc != nil {
								p.sgPut(noc, nrail)
							}
						}
						if _, perr := p.pickRail(); perr == nil {
							fail(s.o.Errors.IO(p.addr, derr)) // another rail is usable: the rail failed, not the peer
							return
						}
					}
					p.h.MarkFailed()
					fail(s.o.Errors.IO(p.addr, derr))
					return
				}
			}
			p.h.MarkHealthy()
			p.sgPut(oc, rail)
		}(lc.oc, lc.rail)
	}
	wg.Wait()
	for i, o := range ops {
		if !started[i] { // every lane connection broke before this op was taken: nothing sent
			unsent[o] = true
		}
	}
	return unsent, first
}

// raiseMax lifts *m to n.
func raiseMax(m *atomic.Int64, n int64) {
	for {
		cur := m.Load()
		if n <= cur || m.CompareAndSwap(cur, n) {
			return
		}
	}
}
