package mds

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// maxGroupSeries bounds the per-group gauges so that arbitrary group names in requests
// cannot grow /metrics without limit.
const maxGroupSeries = 256

// Metrics are the dfkv_mds_* families. A nil *Metrics records nothing.
type Metrics struct {
	Requests      *prometheus.CounterVec   // op, status
	Latency       *prometheus.HistogramVec // op
	Connections   prometheus.Gauge
	ConnsRejected *prometheus.CounterVec // reason
	FramesInvalid *prometheus.CounterVec // reason
	BadRecords    prometheus.Counter
	EtcdUp        prometheus.Gauge
	EtcdProbes    *prometheus.CounterVec // result
	GroupMembers  *prometheus.GaugeVec   // group
	GroupClients  *prometheus.GaugeVec   // group
	EpochChanges  *prometheus.CounterVec // group
	Waiters       prometheus.Gauge       // long polls being held
	WatchListings *prometheus.CounterVec // reason

	mu     sync.Mutex
	groups map[string]bool
	epochs map[string]uint64 // last MembersEpoch seen per group
}

// NewMetrics registers the families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_requests_total", Help: "MDS requests by op and status."}, []string{"op", "status"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dfkv_mds_request_duration_seconds", Help: "Time to answer an MDS request (etcd work included).",
			Buckets: prometheus.ExponentialBuckets(100e-6, 3, 12)}, []string{"op"}),
		Connections:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "dfkv_mds_connections", Help: "Open MDS control connections."}),
		ConnsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_connections_rejected_total", Help: "Connections closed by a listener protection, by reason."}, []string{"reason"}),
		FramesInvalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_invalid_frames_total", Help: "MDS frames refused, by reason."}, []string{"reason"}),
		BadRecords:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_mds_bad_records_total", Help: "etcd records skipped because they did not decode or validate."}),
		EtcdUp:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "dfkv_mds_etcd_up", Help: "1 when the debounced etcd probe succeeds (what /readyz reports)."}),
		EtcdProbes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_etcd_probes_total", Help: "etcd readiness probes by result."}, []string{"result"}),
		GroupMembers:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dfkv_mds_group_members", Help: "Members registered in a group (as of the last listing)."}, []string{"group"}),
		GroupClients:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dfkv_mds_group_clients", Help: "Clients registered in a group (as of the last listing)."}, []string{"group"}),
		EpochChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_group_epoch_changes_total",
			Help: "Changes of a group's MembersEpoch (ring placement) seen by this MDS's listings; the first listing counts one."}, []string{"group"}),
		Waiters: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dfkv_mds_topology_waiters", Help: "Topology long polls this MDS is holding (one per client following the ring)."}),
		WatchListings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_mds_watch_listings_total",
			Help: "Listings of a watched group by reason (event: an etcd watch event; resync: periodic; watch_ended, unhealthy: the watch stopped)."}, []string{"reason"}),
		groups: map[string]bool{},
		epochs: map[string]uint64{},
	}
	reg.MustRegister(m.Requests, m.Latency, m.Connections, m.ConnsRejected, m.FramesInvalid, m.BadRecords, m.EtcdUp, m.EtcdProbes, m.GroupMembers, m.GroupClients, m.EpochChanges, m.Waiters, m.WatchListings)
	return m
}

func (m *Metrics) request(name string, st fb.Status, d time.Duration) {
	if m == nil {
		return
	}
	m.Requests.WithLabelValues(name, fb.EnumNamesStatus[st]).Inc()
	m.Latency.WithLabelValues(name).Observe(d.Seconds())
}

func (m *Metrics) waiters(d float64) {
	if m != nil {
		m.Waiters.Add(d)
	}
}

func (m *Metrics) watchListing(reason string) {
	if m != nil {
		m.WatchListings.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) badRecord() {
	if m != nil {
		m.BadRecords.Inc()
	}
}

func (m *Metrics) track(group string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.groups[group] {
		return true
	}
	if len(m.groups) >= maxGroupSeries {
		return false
	}
	m.groups[group] = true
	return true
}

// Groups returns the groups seen so far (for the background refresher).
func (m *Metrics) Groups() []string {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.groups))
	for g := range m.groups {
		out = append(out, g)
	}
	return out
}

func (m *Metrics) groupMembers(group string, n int) {
	if m != nil && m.track(group) {
		m.GroupMembers.WithLabelValues(group).Set(float64(n))
	}
}

func (m *Metrics) groupEpoch(group string, membersEpoch uint64) {
	if m == nil || !m.track(group) {
		return
	}
	m.mu.Lock()
	changed := m.epochs[group] != membersEpoch
	m.epochs[group] = membersEpoch
	m.mu.Unlock()
	if changed {
		m.EpochChanges.WithLabelValues(group).Inc()
	}
}

func (m *Metrics) groupClients(group string, n int) {
	if m != nil && m.track(group) {
		m.GroupClients.WithLabelValues(group).Set(float64(n))
	}
}

func (m *Metrics) connRejected(reason string) {
	if m != nil {
		m.ConnsRejected.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) frameInvalid(reason string) {
	if m != nil {
		m.FramesInvalid.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) conns(delta float64) {
	if m != nil {
		m.Connections.Add(delta)
	}
}
