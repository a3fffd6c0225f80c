package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/store"
)

// statsCollector exports a snapshot struct as const metrics at scrape time.
type statsCollector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric, descs []*prometheus.Desc)
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch, c.descs) }

// newRAMCollector exports the RAM hot tier's dfkv_ram_* families.
func newRAMCollector(t store.RAMTier) prometheus.Collector {
	type fam struct {
		name, help string
		counter    bool
		get        func(*store.RAMStats) int64
	}
	fams := []fam{
		{"dfkv_ram_hits_total", "GETs served from the RAM arena (no disk I/O).", true, func(s *store.RAMStats) int64 { return s.Hits }},
		{"dfkv_ram_misses_total", "GETs not found in the RAM arena.", true, func(s *store.RAMStats) int64 { return s.Misses }},
		{"dfkv_ram_promoted_total", "Values read from disk straight into an arena slot and kept warm.", true, func(s *store.RAMStats) int64 { return s.Promoted }},
		{"dfkv_ram_evictions_total", "Durable values dropped from the arena to make room (they stay on disk).", true, func(s *store.RAMStats) int64 { return s.Evictions }},
		{"dfkv_ram_evicted_bytes_total", "Arena bytes reclaimed from evicted values.", true, func(s *store.RAMStats) int64 { return s.EvictedBytes }},
		{"dfkv_ram_backpressure_waits_total", "Arena allocations that waited for pinned slots to drain.", true, func(s *store.RAMStats) int64 { return s.BackpressureWaits }},
		{"dfkv_ram_bypassed_total", "Requests served around the tier (no room in time, or value too large).", true, func(s *store.RAMStats) int64 { return s.Bypassed }},
		{"dfkv_ram_arena_bytes", "Size of the preallocated arena.", false, func(s *store.RAMStats) int64 { return s.ArenaBytes }},
		{"dfkv_ram_used_bytes", "Arena bytes held by slots (live, in flight or awaiting reuse).", false, func(s *store.RAMStats) int64 { return s.UsedBytes }},
		{"dfkv_ram_live_bytes", "Bytes of values servable from the arena.", false, func(s *store.RAMStats) int64 { return s.LiveBytes }},
		{"dfkv_ram_objects", "Values servable from the arena.", false, func(s *store.RAMStats) int64 { return s.Objects }},
		{"dfkv_ram_pinned_slots", "Arena slots pinned by in-flight I/O.", false, func(s *store.RAMStats) int64 { return s.Pinned }},
		{"dfkv_ram_backlog", "Arena slots being filled (socket or disk read in flight).", false, func(s *store.RAMStats) int64 { return s.Backlog }},
		{"dfkv_ram_flushed_total", "Write-back: dirty slots written to disk.", true, func(s *store.RAMStats) int64 { return s.Flushed }},
		{"dfkv_ram_flush_dropped_total", "Write-back: dirty slots dropped unwritten (overwritten or removed before their flush).", true, func(s *store.RAMStats) int64 { return s.FlushDropped }},
		{"dfkv_ram_flush_errors_total", "Write-back: flushes that failed (the acknowledged value is lost; its key reads as a miss).", true, func(s *store.RAMStats) int64 { return s.FlushErrors }},
		{"dfkv_ram_flush_deferrals_total", "Write-back: times a flusher held off (at most 1ms each) while PUTs streamed in with the dirty budget under 15/16 full.", true, func(s *store.RAMStats) int64 { return s.FlushDeferrals }},
		{"dfkv_ram_flush_backlog", "Write-back: dirty slots waiting for a flusher.", false, func(s *store.RAMStats) int64 { return s.FlushBacklog }},
		{"dfkv_ram_flush_threads", "Write-back: flusher goroutines (0 unless write-back).", false, func(s *store.RAMStats) int64 { return s.FlushThreads }},
		{"dfkv_ram_dirty_bytes", "Write-back: arena bytes acknowledged but not yet on disk (a crash loses them).", false, func(s *store.RAMStats) int64 { return s.DirtyBytes }},
		{"dfkv_ram_dirty_budget_bytes", "Write-back: the dirty budget (--ram-tier-dirty-bytes).", false, func(s *store.RAMStats) int64 { return s.DirtyBudgetBytes }},
		{"dfkv_ram_dirty_waits_total", "Write-back: PUTs that waited for dirty budget.", true, func(s *store.RAMStats) int64 { return s.DirtyWaits }},
		{"dfkv_ram_overwrite_tombstones_total", "Write-back: overwrites that removed the older durable version from disk before their ack.", true, func(s *store.RAMStats) int64 { return s.Tombstones }},
		{"dfkv_ram_dirty_busy_total", "Write-back: PUTs refused (Busy, sent as CacheFull) after the bounded dirty-budget wait.", true, func(s *store.RAMStats) int64 { return s.DirtyBusy }},
	}
	c := &statsCollector{}
	for _, f := range fams {
		c.descs = append(c.descs, prometheus.NewDesc(f.name, f.help, nil, nil))
	}
	c.collect = func(ch chan<- prometheus.Metric, descs []*prometheus.Desc) {
		s := t.RAMStats()
		for i, f := range fams {
			vt := prometheus.GaugeValue
			if f.counter {
				vt = prometheus.CounterValue
			}
			ch <- prometheus.MustNewConstMetric(descs[i], vt, float64(f.get(&s)))
		}
	}
	return c
}

// newCoalesceCollector exports dfkv_read_coalesce_{leaders,coalesced,timeouts}_total.
func newCoalesceCollector(co store.Coalescer) prometheus.Collector {
	c := &statsCollector{descs: []*prometheus.Desc{
		prometheus.NewDesc("dfkv_read_coalesce_leaders_total", "Cold reads that went to disk on behalf of a coalescing flight.", nil, nil),
		prometheus.NewDesc("dfkv_read_coalesce_coalesced_total", "Reads served by another read's flight (no disk read of their own).", nil, nil),
		prometheus.NewDesc("dfkv_read_coalesce_timeouts_total", "Followers that gave up on a stalled leader and read on their own.", nil, nil),
	}}
	c.collect = func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
		s := co.CoalesceStats()
		ch <- prometheus.MustNewConstMetric(d[0], prometheus.CounterValue, float64(s.Leaders))
		ch <- prometheus.MustNewConstMetric(d[1], prometheus.CounterValue, float64(s.Coalesced))
		ch <- prometheus.MustNewConstMetric(d[2], prometheus.CounterValue, float64(s.Timeouts))
	}
	return c
}

// newQuotaCollector exports per-tenant quota families; tenants not in the quota file are
// summed under tenant="other", so the label set is bounded by the file.
func newQuotaCollector(q store.QuotaReporter) prometheus.Collector {
	l := []string{"tenant"}
	c := &statsCollector{descs: []*prometheus.Desc{
		prometheus.NewDesc("dfkv_quota_used_bytes", "Value bytes charged to the tenant.", l, nil),
		prometheus.NewDesc("dfkv_quota_limit_bytes", "The tenant's byte quota (0 = unlimited).", l, nil),
		prometheus.NewDesc("dfkv_quota_rejected_total", "PUTs refused with QuotaExceeded.", l, nil),
	}}
	c.collect = func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
		for _, u := range q.TenantUsage() {
			ch <- prometheus.MustNewConstMetric(d[0], prometheus.GaugeValue, float64(u.UsedBytes), u.Tenant)
			ch <- prometheus.MustNewConstMetric(d[1], prometheus.GaugeValue, float64(u.LimitBytes), u.Tenant)
			ch <- prometheus.MustNewConstMetric(d[2], prometheus.CounterValue, float64(u.Rejected), u.Tenant)
		}
	}
	return c
}

// newLeaseCollector exports the lease table's dfkv_lease_* families (BatchExistLease).
func newLeaseCollector(l store.Leaser) prometheus.Collector {
	c := &statsCollector{descs: []*prometheus.Desc{
		prometheus.NewDesc("dfkv_lease_granted_total", "Lookups that leased a hit (extensions included).", nil, nil),
		prometheus.NewDesc("dfkv_lease_refused_total", "Hits answered without a lease: the lease budget was spent.", nil, nil),
		prometheus.NewDesc("dfkv_lease_expired_total", "Leases that ended unread at their deadline.", nil, nil),
		prometheus.NewDesc("dfkv_lease_released_total", "Leases ended by the announced read, a removal or an overwrite.", nil, nil),
		prometheus.NewDesc("dfkv_lease_active_bytes", "Capacity protected from eviction by leases now.", nil, nil),
		prometheus.NewDesc("dfkv_lease_limit_bytes", "Most capacity leases may protect at once.", nil, nil),
	}}
	c.collect = func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
		s := l.LeaseStats()
		for i, v := range []int64{s.Granted, s.Refused, s.Expired, s.Released} {
			ch <- prometheus.MustNewConstMetric(d[i], prometheus.CounterValue, float64(v))
		}
		ch <- prometheus.MustNewConstMetric(d[4], prometheus.GaugeValue, float64(s.ActiveBytes))
		ch <- prometheus.MustNewConstMetric(d[5], prometheus.GaugeValue, float64(s.LimitBytes))
	}
	return c
}
