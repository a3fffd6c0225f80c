package railset

import (
	"context"
	"errors"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Exec runs op over RDMA when p is served that way (a multi-SGE op on the SG lane, else
// alone on a scalar connection); handled is false when it was not sent (TCP serves it).
func (p *Peer) Exec(ctx context.Context, op *onesided.Op) (handled bool, err error) {
	if op.MultiSGE() && !sgLaneOff.Load() {
		return p.sgExec(ctx, op)
	}
	return p.do(ctx, []*onesided.Op{op})
}

// do runs ops as one window on one RDMA connection to p (up to the negotiated depth in
// flight, replies in order); handled is false when p is served over TCP. On a broken
// connection its rail is quarantined towards p and the unfinished ops that may run again
// (splitReplay: reads, and writes known not to have been submitted) are replayed on
// another usable rail (completed ones keep their bytes); a write that may have been
// submitted keeps Status Unavailable and err says why. Every wait inside is bounded by
// the I/O timeout (one deadline for the whole call, replays included) and by ctx. With a
// rail whitelist, an op that finds its tier's rails out of credits waits (acquireRail) and
// fails with ErrTimeout when the wait runs out: it never spills to a lower tier or to TCP.
func (p *Peer) do(ctx context.Context, ops []*onesided.Op) (handled bool, err error) {
	s := p.s
	var oc *onesided.Client
	var rail string
	var cerr error
	if anyDirect(ops) {
		oc, rail, cerr = p.connWait(ctx)
	} else {
		oc, rail, cerr = p.conn(ctx)
	}
	if oc == nil {
		if cerr != nil && !errors.Is(cerr, ErrNoCompatibleRail) {
			for _, o := range ops { // credits never came: nothing was submitted
				o.Status = fb.StatusUnavailable
			}
			return true, cerr
		}
		return false, nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.o.IOTimeout)
	defer cancel()
	pending := ops
	var ambErr error // set when some write may have been submitted on a rail that broke
	for {
		stale0 := oc.StaleDropped()
		t0 := time.Now()
		derr := oc.Do(dctx, pending)
		s.railAccount(rail, oc, pending, stale0, derr)
		if derr == nil {
			p.railLatencyObserve(rail, time.Since(t0), len(pending))
			s.rm.ops.WithLabelValues(rail).Add(float64(len(pending)))
			p.h.MarkHealthy()
			p.put(oc, rail)
			return true, ambErr
		}
		p.drop(oc)
		if cerr := ctx.Err(); cerr != nil {
			return true, s.o.Errors.Ctx(p.addr, cerr) // the caller's context ended: not the peer's fault
		}
		var rest []*onesided.Op
		for _, o := range pending {
			if o.Status == fb.StatusUnavailable {
				rest = append(rest, o)
			}
		}
		s.rm.ops.WithLabelValues(rail).Add(float64(len(pending) - len(rest)))
		if dctx.Err() == nil && rail != "" {
			p.quarantineRail(rail)
			replay, amb := splitReplay(rest)
			s.rm.ambiguous.WithLabelValues(rail).Add(float64(amb))
			if len(replay) > 0 {
				if noc, nrail, _ := p.conn(dctx); noc != nil && nrail != rail {
					if amb > 0 {
						ambErr = s.o.Errors.IO(p.addr, derr)
					}
					s.rm.replays.WithLabelValues(nrail).Add(float64(len(replay)))
					s.o.Logger.Info("dfkv: rdma rail broke; replaying unfinished work on another rail",
						"server", p.addr, "from", rail, "to", nrail, "ops", len(replay), "ambiguous", amb, "err", derr)
					oc, rail, pending = noc, nrail, replay
					continue
				} else if noc != nil {
					p.put(noc, nrail)
				}
			}
			if _, perr := p.pickRail(); perr == nil {
				// Another rail of p is still usable: the rail failed, not (known) the peer.
				return true, s.o.Errors.IO(p.addr, derr)
			}
		}
		p.h.MarkFailed()
		return true, s.o.Errors.IO(p.addr, derr)
	}
}

// anyDirect: some op loads into device memory (only RDMA may serve it).
func anyDirect(ops []*onesided.Op) bool {
	for _, o := range ops {
		if o.Direct {
			return true
		}
	}
	return false
}
