package railset

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

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
	// latency.go
	latency      *prometheus.HistogramVec
	latDemotions *prometheus.CounterVec
	latRestores  *prometheus.CounterVec
}

func newRailMetrics() *railMetrics {
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
	return m
}

// sgLaneMetrics are the client's SG lane series.
type sgLaneMetrics struct {
	opened  prometheus.Counter
	full    prometheus.Counter
	busy    atomic.Int64 // lane connections running a request now
	busyMax atomic.Int64 // the most ever at once: the width a batch reached
}

func newSGLaneMetrics() *sgLaneMetrics {
	return &sgLaneMetrics{
		opened: prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_rdma_sg_lane_conns_opened_total",
			Help: "SG lane RDMA connections (depth 1, multi-SGE requests only) this client opened."}),
		full: prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_rdma_sg_lane_full_total",
			Help: "A batch wanted another SG lane connection to a server and the lane was at its bound."}),
	}
}

// register adds the set's dfkv_rdma_* series to reg: per rail, the SG lane's, and the
// data plane's (onesided.Metrics, shared by every connection).
func (s *Set) register(reg prometheus.Registerer) {
	m := s.sg
	reg.MustRegister(s.rm.conns, s.rm.ops, s.rm.quarantines, s.rm.replays, s.rm.noRail, s.rm.credits, s.rm.creditWaits, s.rm.probes,
		s.rm.recoveries, s.rm.compErrors, s.rm.bytes, s.rm.stale, s.rm.ambiguous, s.rm.latency, s.rm.latDemotions, s.rm.latRestores)
	reg.MustRegister(m.opened, m.full,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_rdma_sg_lane_conns",
			Help: "SG lane RDMA connections open now (all servers)."}, func() float64 { return float64(s.sgLaneConns()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_rdma_sg_lane_busy",
			Help: "SG lane connections running a request now."}, func() float64 { return float64(m.busy.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_rdma_sg_lane_busy_max",
			Help: "The most SG lane connections ever running a request at once (a batch's SG width)."},
			func() float64 { return float64(m.busyMax.Load()) }))
	for name := range s.m.Snapshot() {
		n := name
		f := func() float64 { return s.m.Snapshot()[n] }
		if strings.HasSuffix(n, "_total") {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		} else {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		}
	}
}
