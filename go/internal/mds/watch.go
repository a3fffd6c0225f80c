package mds

import (
	"context"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// Long polls. A client asks for the topology with the TopologyEpoch it already has and a
// wait; the MDS answers as soon as the group's topology differs, or with "unchanged" when
// the wait ends. Every replica keeps, per group that is being waited on, a copy of the
// topology that an etcd watch keeps current (the watch is only a doorbell: each change
// triggers one linearizable listing, whose result is the truth). The copy is derived from
// etcd and rebuilt from it at any time, so the MDS stays stateless: any replica answers any
// long poll, and a restarted replica answers the same.

const (
	// MaxWait caps a long poll's wait (a client asking more gets this).
	MaxWait = 60 * time.Second
	// maxWatchedGroups bounds the watches one replica runs; long polls on further groups are
	// answered at once (their clients then poll).
	maxWatchedGroups = 64
	// watchIdle stops a group's watch when nobody long-polled it for this long.
	watchIdle = 5 * time.Minute
	// watchResync relists a watched group this often even without events: a safety net
	// that bounds the staleness of a copy whose watch missed something.
	watchResync = 30 * time.Second
	// unsyncedRecheck: while a group's copy is not trusted (no watch, etcd unhealthy),
	// waiters list directly at least this often.
	unsyncedRecheck = time.Second
	// healthCheck is how often a watch loop consults Config.Healthy.
	healthCheck = 250 * time.Millisecond
)

// groupWatch is one group's watched copy.
type groupWatch struct {
	svc   *Service
	group string

	mu      sync.Mutex
	topo    *wire.Topology // last listing; nil before the first
	synced  bool           // topo is current: the watch runs and etcd is healthy
	changed chan struct{}  // closed (and replaced) whenever topo or synced changes
	waiters int
	used    time.Time
}

// state returns the copy, whether it is trusted, and a channel that closes at its next change.
func (g *groupWatch) state() (*wire.Topology, bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.topo, g.synced, g.changed
}

func (g *groupWatch) publish(topo *wire.Topology, synced bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if topo != nil {
		g.topo = topo
	}
	if topo == nil && synced == g.synced {
		return
	}
	g.synced = synced
	close(g.changed)
	g.changed = make(chan struct{})
}

// idle reports (and, when true, retires) a group nobody waits on or has waited on lately.
func (g *groupWatch) idle() bool {
	s := g.svc
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiters > 0 || time.Since(g.used) < watchIdle {
		return false
	}
	delete(s.watches, g.group)
	return true
}

// run keeps the copy current until the group goes idle or the service stops.
func (g *groupWatch) run(w Watcher) {
	s := g.svc
	defer s.watchWG.Done()
	prefix := MembersPrefix(g.group)
	backoff := 50 * time.Millisecond
	healthy := func() bool { return s.cfg.Healthy == nil || s.cfg.Healthy() == nil }
	tick := time.NewTicker(healthCheck)
	defer tick.Stop()
	for {
		select {
		case <-s.stopWaits:
			return
		default:
		}
		if g.idle() {
			return
		}
		rev, ok := g.list(w, prefix, healthy())
		if !ok {
			g.publish(nil, false)
			select {
			case <-s.stopWaits:
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		events := w.Watch(ctx, prefix, rev+1)
		resync := time.NewTimer(watchResync)
	watching:
		for {
			select {
			case <-s.stopWaits:
				cancel()
				resync.Stop()
				return
			case _, open := <-events:
				if !open {
					s.cfg.Metrics.watchListing("watch_ended")
					break watching
				}
				s.cfg.Metrics.watchListing("event")
				if _, ok := g.list(w, prefix, healthy()); !ok {
					break watching
				}
			case <-resync.C:
				s.cfg.Metrics.watchListing("resync")
				if _, ok := g.list(w, prefix, healthy()); !ok {
					break watching
				}
				resync.Reset(watchResync)
			case <-tick.C:
				if !healthy() {
					// etcd is (debounced) unreachable from this replica: stop trusting the
					// copy, so that waiters move to a replica that can see etcd. The watch is
					// restarted from a fresh listing once etcd is back.
					s.cfg.Metrics.watchListing("unhealthy")
					break watching
				}
				if g.idle() {
					cancel()
					resync.Stop()
					return
				}
			}
		}
		cancel()
		resync.Stop()
		g.publish(nil, false)
	}
}

// list lists the group and publishes the result; ok is false when the listing failed or
// etcd is unhealthy (the copy is then published as untrusted).
func (g *groupWatch) list(w Watcher, prefix string, healthy bool) (int64, bool) {
	s := g.svc
	if !healthy {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	kvs, rev, err := w.ListRev(ctx, prefix, min(s.cfg.MaxList, wire.MaxMdsMembers))
	cancel()
	if err != nil {
		s.cfg.Logger.Warn("mds watch: listing failed; long polls fall back to direct reads", "group", g.group, "err", err)
		return 0, false
	}
	g.publish(s.buildTopology(g.group, kvs), true)
	return rev, true
}

// watch returns the group's watched copy, starting its watch on first use, with one more
// waiter counted (under watchMu, so that an idle watch cannot retire between the lookup and
// the count; the caller must call done); nil when the store cannot watch, the service is
// stopping or too many groups are watched.
func (s *Service) watch(group string) *groupWatch {
	w, ok := s.cfg.Store.(Watcher)
	if !ok {
		return nil
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.waitsStopped {
		return nil
	}
	g := s.watches[group]
	if g == nil {
		if len(s.watches) >= maxWatchedGroups {
			return nil
		}
		g = &groupWatch{svc: s, group: group, changed: make(chan struct{})}
		s.watches[group] = g
		s.watchWG.Add(1)
		go g.run(w)
	}
	g.mu.Lock()
	g.waiters++
	g.used = time.Now()
	g.mu.Unlock()
	s.cfg.Metrics.waiters(1)
	return g
}

// done ends one waiter counted by Service.watch.
func (g *groupWatch) done() {
	g.mu.Lock()
	g.waiters--
	g.used = time.Now()
	g.mu.Unlock()
	g.svc.cfg.Metrics.waiters(-1)
}

// longPoll answers a ListTopology with a wait. It returns the topology as soon as its
// TopologyEpoch differs from known, or a reply without a topology when wait ends first.
// While the group's copy is untrusted it reads etcd directly (an error then sends the
// client to another replica).
func (s *Service) longPoll(ctx context.Context, group string, known uint64, wait time.Duration) (*wire.MdsResponse, error) {
	wait = min(wait, MaxWait)
	waitMS := uint32(wait / time.Millisecond)
	ttlMS := uint32(s.cfg.LeaseTTL / time.Millisecond)
	g := s.watch(group)
	if g == nil {
		topo, err := s.topologyNow(ctx, group)
		if err != nil {
			return nil, err
		}
		return &wire.MdsResponse{LeaseTTLMS: ttlMS, Topology: topo}, nil // WaitMS 0: poll me
	}
	defer g.done()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		topo, synced, changed := g.state()
		var recheck <-chan time.Time
		if !synced {
			direct, err := s.topologyNow(ctx, group)
			if err != nil {
				return nil, err
			}
			topo = direct
			recheck = time.After(unsyncedRecheck)
		}
		if topo != nil && topo.TopologyEpoch != known {
			return &wire.MdsResponse{LeaseTTLMS: ttlMS, Topology: topo, WaitMS: waitMS}, nil
		}
		select {
		case <-changed:
		case <-recheck:
		case <-deadline.C:
			return &wire.MdsResponse{LeaseTTLMS: ttlMS, WaitMS: waitMS}, nil
		case <-ctx.Done():
			return &wire.MdsResponse{LeaseTTLMS: ttlMS, WaitMS: waitMS}, nil
		case <-s.stopWaits:
			return &wire.MdsResponse{LeaseTTLMS: ttlMS, WaitMS: waitMS}, nil
		}
	}
}

// topologyNow is a direct, linearizable read bounded by the call timeout.
func (s *Service) topologyNow(ctx context.Context, group string) (*wire.Topology, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	return s.Topology(ctx, group)
}

// Close answers every long poll in flight ("unchanged") and stops the watches; later long
// polls are answered at once (as plain polls). Call it after the servers are shut down.
func (s *Service) Close() {
	s.watchMu.Lock()
	if !s.waitsStopped {
		s.waitsStopped = true
		close(s.stopWaits)
	}
	s.watchMu.Unlock()
	s.watchWG.Wait()
}
