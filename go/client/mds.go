package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
	"github.com/dfkv/dfkv/go/ring"
)

// MDSOptions configure MDS discovery (and, optionally, client registration).
type MDSOptions struct {
	Endpoints []string // MDS replicas, host:port
	Group     string   // default "default"
	// Poll is the topology poll period (default 3s) when the MDS does not hold long polls
	// (an older MDS), after a failed call, and while the shrink guard holds a topology.
	Poll time.Duration
	// LongPoll is how long the MDS may hold a topology request until the ring changes
	// (default DefaultLongPoll; negative: never long-poll, poll every Poll). A change
	// reaches the client as soon as the MDS sees it in etcd.
	LongPoll time.Duration
	// ShrinkPolls: a topology that removes more than half of the current members is adopted
	// only after this many consecutive polls returned such a shrink (default 3; 1 = at once).
	ShrinkPolls int
	// CallTimeout bounds one request to one replica (default 2s).
	CallTimeout time.Duration
	// InitialWait bounds the first topology fetch in NewMDSMembership (default 2×CallTimeout
	// per replica). When no MDS answers in time the membership starts empty (every request is
	// a miss) and keeps polling.
	InitialWait time.Duration

	// Register makes this process visible under the group's clients prefix (never in the
	// ring). (The C ABI clears it when DFKV_CLIENT_REGISTER=0; this package reads no
	// environment.)
	Register  bool
	ClientID  string        // default "<hostname>-<pid>-<random>"
	Info      []wire.KV     // client_info
	Heartbeat time.Duration // default a third of the MDS lease TTL
	Logger    *slog.Logger
	// TLS dials the MDS replicas with TLS 1.3 (see TLSFromFiles); Token is sent with every
	// call to an MDS run with --auth-tokens.
	TLS   *tls.Config
	Token string
	// RingPointsPerWeight is the placement ring's density (0 = ring.PointsPerWeight).
	// Every client of a cluster must use the same value.
	RingPointsPerWeight int
}

// MDSMembership follows a group's topology through the MDS. It swaps in a new View
// atomically when the MembersEpoch changes, keeps the last good view while no MDS answers,
// and applies the shrink guard. It implements prometheus.Collector (dfkv_client_mds_*);
// a Client built on it exports those families in its snapshot.
type MDSMembership struct {
	o      MDSOptions
	rpc    *mdsclient.Client
	holder *mdsclient.Holder
	view   atomic.Pointer[View]
	// rails: each member's published RDMA rails by address, from the latest topology (rail
	// health moves topology_epoch, not members_epoch, so it is kept apart from the view).
	rails atomic.Pointer[map[string][]wire.Rail]

	// ctx ends on Close: it interrupts the poll in flight, so Close never waits out a
	// stalled MDS. done closes when the poll loop has returned.
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex // guards the fields below; never held across an RPC
	polled     int        // successful polls so far
	shrinkSeen int        // consecutive polls that returned a guarded shrink
	recent     []recentView
	lastErr    error
	topoEpoch  uint64 // TopologyEpoch of the last topology received (adopted or not)

	polls       *prometheus.CounterVec
	viewChanges prometheus.Counter
	shrinkHeld  prometheus.Counter
	members     prometheus.Gauge
	registered  prometheus.GaugeFunc
	regErrors   prometheus.Counter
}

// recentView is a ring the client routed by within the last ShrinkPolls polls: the shrink
// guard measures a candidate against all of them, so that a loss spread over several polls
// (leases expiring one sweep apart) is judged as one.
type recentView struct {
	ids   map[string]bool
	until int // poll after which it stopped being current; -1 while current
}

// DefaultLongPoll is MDSOptions.LongPoll's default: short enough that a replica that stops
// answering without closing its connection (a hung process, a partition) is left within
// it, long enough that an idle client costs the MDS a few requests a minute.
const DefaultLongPoll = 10 * time.Second

// ErrNoMDS: MDS discovery was asked for without endpoints.
var ErrNoMDS = errors.New("dfkv: no MDS endpoints")

// NewMDSMembership fetches the topology once (bounded by InitialWait) and starts polling.
func NewMDSMembership(o MDSOptions) (*MDSMembership, error) {
	if len(o.Endpoints) == 0 {
		return nil, ErrNoMDS
	}
	if o.Group == "" {
		o.Group = "default"
	}
	if _, err := ring.New(nil, ring.WithPointsPerWeight(o.RingPointsPerWeight)); err != nil {
		return nil, fmt.Errorf("dfkv: %w", err)
	}
	if o.Poll <= 0 {
		o.Poll = 3 * time.Second
	}
	if o.LongPoll == 0 {
		o.LongPoll = DefaultLongPoll
	}
	o.LongPoll = min(o.LongPoll, time.Minute)
	if o.ShrinkPolls <= 0 {
		o.ShrinkPolls = 3
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 2 * time.Second
	}
	if o.InitialWait <= 0 {
		o.InitialWait = o.CallTimeout * time.Duration(len(o.Endpoints)+1)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	rpc, err := mdsclient.New(o.Endpoints, mdsclient.Options{CallTimeout: o.CallTimeout, TLS: o.TLS, Token: o.Token})
	if err != nil {
		return nil, fmt.Errorf("dfkv: %w", err)
	}
	m := &MDSMembership{o: o, rpc: rpc, done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.polls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_client_mds_polls_total", Help: "Topology polls by result (ok, error)."}, []string{"result"})
	m.viewChanges = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_mds_view_changes_total", Help: "Ring rebuilds after a MembersEpoch change."})
	m.shrinkHeld = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_mds_shrink_held_total", Help: "Polls whose topology shrank the ring by more than half and was held back by the shrink guard."})
	m.members = prometheus.NewGauge(prometheus.GaugeOpts{Name: "dfkv_client_mds_members", Help: "Members in the ring the client routes by."})
	m.regErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_mds_registration_errors_total", Help: "Failed client registration or heartbeat calls."})
	m.registered = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_client_mds_registered", Help: "1 while this client is registered with the MDS."}, func() float64 {
		if m.holder != nil && m.holder.Registered() {
			return 1
		}
		return 0
	})
	empty, _ := NewView(nil, 0)
	m.view.Store(empty)

	ctx, cancel := context.WithTimeout(m.ctx, o.InitialWait)
	if _, err := m.poll(ctx, 0); err != nil {
		o.Logger.Warn("dfkv: no topology from the MDS yet; starting with an empty ring and polling", "endpoints", o.Endpoints, "err", err)
	}
	cancel()

	if o.Register {
		if err := m.startRegistration(); err != nil {
			m.cancel()
			rpc.Close()
			return nil, err
		}
	}
	go m.loop()
	return m, nil
}

func (m *MDSMembership) startRegistration() error {
	id := m.o.ClientID
	host, _ := os.Hostname()
	if id == "" {
		var rnd [4]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return fmt.Errorf("dfkv: client id: %w", err)
		}
		id = fmt.Sprintf("%s-%d-%x", host, os.Getpid(), rnd)
	}
	info := &wire.ClientInfo{ID: id, Info: m.o.Info, PID: uint64(os.Getpid()), Hostname: host, RegisteredUnixMS: uint64(time.Now().UnixMilli())}
	// A separate RPC client: registration heartbeats must not queue behind a slow poll.
	rpc, err := mdsclient.New(m.o.Endpoints, mdsclient.Options{CallTimeout: m.o.CallTimeout, TLS: m.o.TLS, Token: m.o.Token})
	if err != nil {
		return fmt.Errorf("dfkv: %w", err)
	}
	h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: rpc, Group: m.o.Group, Info: info, Heartbeat: m.o.Heartbeat,
		Logger: m.o.Logger, OnError: func(error) { m.regErrors.Inc() }})
	if err != nil {
		return fmt.Errorf("dfkv: %w", err)
	}
	m.holder = h
	h.Start()
	return nil
}

// loop follows the topology: back-to-back long polls while the MDS holds them, else (an
// older MDS, a failed call, a topology held by the shrink guard) a plain poll every Poll.
func (m *MDSMembership) loop() {
	defer close(m.done)
	held := true // the last answer was a long poll (or none yet): ask at once
	for {
		m.mu.Lock()
		guarding := m.shrinkSeen > 0
		m.mu.Unlock()
		wait := m.o.LongPoll
		if guarding || wait < 0 {
			wait = 0 // the guard counts consecutive answers: they must come every Poll
		}
		if !held || wait == 0 {
			t := time.NewTimer(m.o.Poll)
			select {
			case <-m.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if m.ctx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, wait+m.o.CallTimeout*time.Duration(len(m.o.Endpoints)+1))
		var err error
		held, err = m.poll(ctx, wait)
		if err != nil {
			m.o.Logger.Debug("dfkv: topology poll failed; keeping the last good ring", "err", err)
		}
		cancel()
	}
}

// poll fetches the topology once (a long poll when wait > 0) and applies it; held reports
// that the MDS honoured the wait. The fetch runs without m.mu: only the view swap and the
// shrink-guard bookkeeping take it. Polls themselves are sequential (the first from
// NewMDSMembership, the rest from loop), so the view cannot change under a fetch.
func (m *MDSMembership) poll(ctx context.Context, wait time.Duration) (held bool, err error) {
	known := m.view.Load().Epoch
	m.mu.Lock()
	knownTopo := m.topoEpoch
	m.mu.Unlock()
	req := &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: m.o.Group, KnownMembersEpoch: known}
	if wait > 0 {
		req.WaitMS, req.KnownTopologyEpoch = uint32(wait/time.Millisecond), knownTopo
	}
	resp, _, err := m.rpc.Call(ctx, req)
	unchanged := err == nil && resp.Topology == nil && wait > 0 && resp.WaitMS > 0
	if err == nil && resp.Topology == nil && !unchanged {
		err = fmt.Errorf("%w: topology reply without a topology", ErrProtocol)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.polls.WithLabelValues("error").Inc()
		if m.lastErr == nil {
			m.o.Logger.Warn("dfkv: MDS unreachable; keeping the last good ring", "err", err)
		}
		m.lastErr = err
		return false, err
	}
	m.polls.WithLabelValues("ok").Inc()
	held = wait > 0 && resp.WaitMS > 0
	if m.lastErr != nil {
		m.o.Logger.Info("dfkv: MDS reachable again")
		m.lastErr = nil
	}
	if unchanged {
		m.polled++
		return held, nil
	}
	m.topoEpoch = resp.Topology.TopologyEpoch
	rails := make(map[string][]wire.Rail, len(resp.Topology.Members))
	for _, tm := range resp.Topology.Members {
		rails[tm.Addr] = tm.Rails
	}
	m.rails.Store(&rails)
	m.polled++
	return held, m.apply(resp.Topology)
}

// apply installs topo when its MembersEpoch differs from the current view's, subject to the
// shrink guard: a candidate that removes more than half of the members the client routed by
// during the last ShrinkPolls polls is adopted only when ShrinkPolls consecutive polls
// returned such a shrink. Callers hold m.mu.
func (m *MDSMembership) apply(topo *wire.Topology) error {
	cur := m.view.Load()
	m.pruneRecent()
	if topo.MembersEpoch == cur.Epoch {
		m.shrinkSeen = 0
		return nil
	}
	members := make([]Member, 0, len(topo.Members))
	keep := map[string]bool{}
	for _, tm := range topo.Members {
		if tm.Eligible {
			members = append(members, Member{ID: tm.ID, Addr: tm.Addr, Weight: tm.Weight})
			keep[tm.ID] = true
		}
	}
	ref := map[string]bool{}
	for _, r := range m.recent {
		for id := range r.ids {
			ref[id] = true
		}
	}
	removed := 0
	for id := range ref {
		if !keep[id] {
			removed++
		}
	}
	guarded := len(ref) > 0 && 2*removed > len(ref)
	if guarded {
		m.shrinkSeen++
		if m.shrinkSeen < m.o.ShrinkPolls {
			m.shrinkHeld.Inc()
			m.o.Logger.Warn("dfkv: topology would remove more than half of the ring; holding it",
				"recent", len(ref), "removed", removed, "poll", m.shrinkSeen, "of", m.o.ShrinkPolls)
			return nil
		}
	}
	m.shrinkSeen = 0
	v, err := NewView(members, topo.MembersEpoch, ring.WithPointsPerWeight(m.o.RingPointsPerWeight))
	if err != nil {
		return fmt.Errorf("dfkv: topology from the MDS rejected, keeping the last good ring: %w", err)
	}
	for i := range m.recent {
		if m.recent[i].until < 0 {
			m.recent[i].until = m.polled
		}
	}
	if guarded {
		m.recent = m.recent[:0] // the shrink persisted: it is the new reference
	}
	m.recent = append(m.recent, recentView{ids: keep, until: -1})
	m.view.Store(v)
	m.viewChanges.Inc()
	m.members.Set(float64(len(v.Members)))
	m.o.Logger.Info("dfkv: ring updated", "members", len(v.Members), "epoch", strconv.FormatUint(v.Epoch, 16))
	return nil
}

// pruneRecent forgets views that stopped being current ShrinkPolls or more polls ago.
func (m *MDSMembership) pruneRecent() {
	out := m.recent[:0]
	for _, r := range m.recent {
		if r.until < 0 || m.polled-r.until < m.o.ShrinkPolls {
			out = append(out, r)
		}
	}
	m.recent = out
}

// PublishedRails returns the RDMA rails the member at addr publishes in the latest
// topology (known is true: the membership is MDS-based; an empty list means none).
func (m *MDSMembership) PublishedRails(addr string) (rails []wire.Rail, known bool) {
	if p := m.rails.Load(); p != nil {
		return (*p)[addr], true
	}
	return nil, true
}

// View returns the current routing snapshot.
func (m *MDSMembership) View() *View { return m.view.Load() }

// Registered reports whether the client registration (if any) is currently live.
func (m *MDSMembership) Registered() bool { return m.holder != nil && m.holder.Registered() }

// Close stops polling, interrupting a poll in flight, waits for the poll loop to return, and
// deregisters the client (bounded by CallTimeout).
func (m *MDSMembership) Close() error {
	m.closeOnce.Do(func() {
		m.cancel()
		<-m.done
		if m.holder != nil {
			ctx, cancel := context.WithTimeout(context.Background(), m.o.CallTimeout)
			_ = m.holder.Stop(ctx)
			cancel()
		}
		m.rpc.Close()
	})
	return nil
}

// Describe and Collect make the membership a prometheus.Collector.
func (m *MDSMembership) Describe(ch chan<- *prometheus.Desc) {
	m.polls.Describe(ch)
	m.viewChanges.Describe(ch)
	m.shrinkHeld.Describe(ch)
	m.members.Describe(ch)
	m.regErrors.Describe(ch)
	m.registered.Describe(ch)
}

func (m *MDSMembership) Collect(ch chan<- prometheus.Metric) {
	m.polls.Collect(ch)
	m.viewChanges.Collect(ch)
	m.shrinkHeld.Collect(ch)
	m.members.Collect(ch)
	m.regErrors.Collect(ch)
	m.registered.Collect(ch)
}
