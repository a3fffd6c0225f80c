package client

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// railPublisher is a membership that knows each member's published RDMA rails (the MDS
// topology's Member.rails). A static membership is not one.
type railPublisher interface {
	PublishedRails(addr string) (rails []wire.Rail, known bool)
}

// defaultRailQuarantine bounds how long a rail that failed towards a peer is avoided.
const defaultRailQuarantine = 10 * time.Second

// railConfig is the client's rail policy (RDMAOptions.Devices / Primary / Tiers).
type railConfig struct {
	devices []string       // the whitelist in order; empty: one device, today's behaviour
	tier    map[string]int // the client's tier of each device (all 0 without Tiers)
	tiered  bool           // Tiers were configured: members without rails fail closed
	primary string
	// slowFactor demotes a rail slower than this times its tier's best (0: off); raillatency.go.
	slowFactor float64
}

// newRailConfig validates the options: every tiered device must be whitelisted and the
// whitelist must be covered by the tiers; the primary must be whitelisted.
func newRailConfig(o *RDMAOptions) (railConfig, error) {
	rc := railConfig{devices: slices.Clone(o.Devices), tier: map[string]int{}, primary: o.Primary}
	f, err := railSlowFactor(o)
	if err != nil {
		return rc, err
	}
	rc.slowFactor = f
	seen := map[string]bool{}
	for _, d := range rc.devices {
		if d == "" || seen[d] {
			return rc, fmt.Errorf("dfkv: rdma devices %q: empty or repeated name: %w", o.Devices, ErrInvalid)
		}
		seen[d] = true
		rc.tier[d] = 0
	}
	if len(o.Tiers) > 0 {
		if len(rc.devices) == 0 {
			return rc, fmt.Errorf("dfkv: rdma tiers need a device list: %w", ErrInvalid)
		}
		rc.tiered = true
		placed := map[string]bool{}
		for t, ds := range o.Tiers {
			if len(ds) == 0 {
				return rc, fmt.Errorf("dfkv: rdma tier %d is empty: %w", t, ErrInvalid)
			}
			for _, d := range ds {
				if !seen[d] || placed[d] {
					return rc, fmt.Errorf("dfkv: rdma tiers: device %q not in the device list or placed twice: %w", d, ErrInvalid)
				}
				placed[d] = true
				rc.tier[d] = t
			}
		}
		if len(placed) != len(seen) {
			return rc, fmt.Errorf("dfkv: rdma tiers leave a listed device out: %w", ErrInvalid)
		}
	}
	if rc.primary != "" && len(rc.devices) > 0 && !seen[rc.primary] {
		return rc, fmt.Errorf("dfkv: rdma primary %q is not in the device list: %w", rc.primary, ErrInvalid)
	}
	return rc, nil
}

// candidates returns the rails to use towards a member, in preference order: the usable
// ones of the highest tier that has any (the primary first, else list order). usable says
// whether the client itself may use a rail towards this peer now (not quarantined).
//
//   - No whitelist: nil, nil (one device, chosen as before rails).
//   - Rails not published (a static membership, or a member without rails): the whitelist
//     when the client has no tiers; with tiers, fail closed (ErrNoCompatibleRail).
//   - Published: whitelist ∩ published Healthy ∩ usable; the tier is the client's when
//     it has tiers, else the member's. None: ErrNoCompatibleRail.
func (rc *railConfig) candidates(published []wire.Rail, usable func(string) bool) ([]string, error) {
	if len(rc.devices) == 0 {
		return nil, nil
	}
	tierOf := map[string]int{}
	if len(published) == 0 {
		if rc.tiered {
			return nil, fmt.Errorf("rdma tiers configured but the server publishes no rails: %w", ErrNoCompatibleRail)
		}
		for _, d := range rc.devices {
			tierOf[d] = 0
		}
	} else {
		for _, r := range published {
			if _, ok := rc.tier[r.Device]; ok && r.Usable() {
				if rc.tiered {
					tierOf[r.Device] = rc.tier[r.Device]
				} else {
					tierOf[r.Device] = int(r.Tier)
				}
			}
		}
	}
	best := -1
	for _, d := range rc.devices {
		if t, ok := tierOf[d]; ok && usable(d) && (best < 0 || t < best) {
			best = t
		}
	}
	if best < 0 {
		if len(published) == 0 {
			return nil, fmt.Errorf("every rail of %q is quarantined: %w", rc.devices, ErrNoCompatibleRail)
		}
		return nil, fmt.Errorf("the server publishes no healthy rail of %q: %w", rc.devices, ErrNoCompatibleRail)
	}
	var out []string
	for _, d := range rc.devices {
		if t, ok := tierOf[d]; ok && t == best && usable(d) {
			if d == rc.primary {
				out = append([]string{d}, out...)
			} else {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// railMetrics are the client's per-rail series (label rail = the local device name; "" is
// the single default device).
type railMetrics struct {
	conns       *prometheus.CounterVec
	ops         *prometheus.CounterVec
	quarantines *prometheus.CounterVec
	replays     *prometheus.CounterVec
	noRail      prometheus.Counter
	// docs/RDMA.md §4: credits, probing, fencing, per-rail traffic.
	credits     *prometheus.GaugeVec
	creditWaits *prometheus.CounterVec
	probes      *prometheus.CounterVec
	recoveries  *prometheus.CounterVec
	compErrors  *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	stale       *prometheus.CounterVec
	ambiguous   *prometheus.CounterVec
	// raillatency.go
	latency      *prometheus.HistogramVec
	latDemotions *prometheus.CounterVec
	latRestores  *prometheus.CounterVec
}

func newRailMetrics(reg prometheus.Registerer) *railMetrics {
	m := &railMetrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_rdma_client_rail_conns_opened_total",
			Help: "RDMA connections this client opened, per local rail."}, []string{"rail"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_rdma_client_rail_ops_total",
			Help: "RDMA requests this client completed, per local rail."}, []string{"rail"}),
		quarantines: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_rdma_client_rail_quarantines_total",
			Help: "A rail quarantined towards one server after a connection or completion failure."}, []string{"rail"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_rdma_client_rail_replayed_ops_total",
			Help: "Unfinished GET/EXIST requests replayed on this rail after another rail broke."}, []string{"rail"}),
		noRail: prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_rdma_client_no_compatible_rail_total",
			Help: "Ops sent over TCP because no compatible RDMA rail was usable (peer health untouched)."}),
	}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"rail"})
	}
	m.credits = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dfkv_rdma_client_rail_credits_in_use",
		Help: "Credits in use per local rail (connections carrying a window), all servers."}, []string{"rail"})
	m.creditWaits = vec("dfkv_rdma_client_rail_credit_waits_total", "Ops that waited for a credit of this rail's tier and got one on this rail.")
	m.probes = vec("dfkv_rdma_client_rail_probes_total", "Probes of this rail while it was quarantined towards a server.")
	m.recoveries = vec("dfkv_rdma_client_rail_recoveries_total", "Quarantines of this rail ended by a successful probe.")
	m.compErrors = vec("dfkv_rdma_client_rail_completion_errors_total", "RDMA connections on this rail broken by a failed work completion.")
	m.bytes = vec("dfkv_rdma_client_rail_bytes_total", "Value bytes moved over this rail (PUT sources, GET results).")
	m.stale = vec("dfkv_rdma_client_rail_stale_completions_total", "Completions of an older QP generation dropped on this rail.")
	m.ambiguous = vec("dfkv_rdma_client_rail_ambiguous_writes_total", "PUT/REMOVE ops possibly submitted on this rail when it broke: returned as errors, never replayed.")
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dfkv_rdma_client_rail_latency_seconds",
		Help:    "Seconds per completed op on this rail (each successful window's time over its op count), all servers.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10)}, []string{"rail"})
	m.latDemotions = vec("dfkv_rdma_client_rail_latency_demotions_total", "Times this rail was demoted inside its tier towards a server for latency (EWMA above RailSlowFactor x the tier's best).")
	m.latRestores = vec("dfkv_rdma_client_rail_latency_restores_total", "Times a latency demotion of this rail towards a server ended (its EWMA came back down).")
	reg.MustRegister(m.conns, m.ops, m.quarantines, m.replays, m.noRail, m.credits, m.creditWaits, m.probes,
		m.recoveries, m.compErrors, m.bytes, m.stale, m.ambiguous, m.latency, m.latDemotions, m.latRestores)
	return m
}

// quarantined reports whether rail is quarantined towards this peer now.
func (r *peerRDMA) quarantined(rail string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.quar[rail]
	return ok && now.Before(t)
}

// quarantine avoids rail towards this peer for d and closes its idle connections there;
// it reports whether the rail was not quarantined before (a new quarantine, counted).
func (r *peerRDMA) quarantine(rail string, d time.Duration) bool {
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
