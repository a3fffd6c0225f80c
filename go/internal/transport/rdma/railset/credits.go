package railset

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Per-rail credits (docs/RDMA.md §4, "Credits and backpressure"). A credit is one RDMA
// connection in use on a rail towards one server: its window carries up to Depth requests
// in flight. Each rail towards a server has RailCredits of them. An op takes a credit on
// the first rail of the chosen (highest usable) tier that has one, in preference order;
// when every rail of that tier is at its budget it WAITS for a credit of that tier,
// bounded by its context and the I/O timeout, and then fails with ErrTimeout. Congestion
// never moves an op to a lower tier (nor to TCP): only health does.

// railCreditRecheck bounds one wait for a credit so that health changes (a quarantine that
// ends, a rail published again) are noticed while waiting.
const railCreditRecheck = 20 * time.Millisecond

// railCredits counts the credits in use per rail towards one server.
type railCredits struct {
	mu    sync.Mutex
	inUse map[string]int
	wake  chan struct{} // closed (and replaced) when a credit is given back
}

// tryTake takes a credit on rail when fewer than budget are in use.
func (rc *railCredits) tryTake(rail string, budget int) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.inUse[rail] >= budget {
		return false
	}
	if rc.inUse == nil {
		rc.inUse = map[string]int{}
	}
	rc.inUse[rail]++
	return true
}

func (rc *railCredits) release(rail string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.inUse[rail] > 0 {
		rc.inUse[rail]--
	}
	if rc.wake != nil {
		close(rc.wake)
		rc.wake = nil
	}
}

func (rc *railCredits) used(rail string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.inUse[rail]
}

// waitCh is closed at the next release.
func (rc *railCredits) waitCh() <-chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.wake == nil {
		rc.wake = make(chan struct{})
	}
	return rc.wake
}

// railCreditBudget is the credits per rail towards one server (RailCredits, else MaxConns,
// else the pool size).
func (s *Set) railCreditBudget() int {
	o := &s.o
	switch {
	case o.RailCredits > 0:
		return o.RailCredits
	case o.MaxConns > 0:
		return o.MaxConns
	}
	return max(o.PoolSize, 1)
}

// acquireRail chooses p's rail for one connection's use and takes a credit on it. Without
// a whitelist it returns "" and takes nothing. The rails are those of the highest usable
// tier (health and quarantine decide the tier), tried in preference order (primary, NUMA
// locality, round robin); when all are at their budget it waits for one of that tier.
func (p *Peer) acquireRail(ctx context.Context) (string, error) {
	s := p.s
	if len(s.rc.devices) == 0 {
		return "", nil
	}
	budget := s.railCreditBudget()
	deadline := time.Now().Add(s.o.IOTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	waited := false
	for {
		order, err := p.railOrder()
		if err != nil {
			return "", err
		}
		for _, rail := range order {
			if p.px.credits.tryTake(rail, budget) {
				s.rm.credits.WithLabelValues(rail).Inc()
				if waited {
					s.rm.creditWaits.WithLabelValues(rail).Inc()
				}
				return rail, nil
			}
		}
		waited = true
		wake := p.px.credits.waitCh()
		left := time.Until(deadline)
		if left <= 0 {
			return "", fmt.Errorf("dfkv: server %s: every rail of %q at its %d credits: %w", p.addr, order, budget, s.o.Errors.Timeout)
		}
		t := time.NewTimer(min(left, railCreditRecheck))
		select {
		case <-ctx.Done():
			t.Stop()
			return "", s.o.Errors.Ctx(p.addr, ctx.Err())
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// releaseRail gives back a credit taken by acquireRail ("" took none).
func (p *Peer) releaseRail(rail string) {
	if rail == "" || len(p.s.rc.devices) == 0 {
		return
	}
	p.px.credits.release(rail)
	p.s.rm.credits.WithLabelValues(rail).Dec()
}
