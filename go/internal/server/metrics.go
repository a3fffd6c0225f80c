package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Metrics are the server's Prometheus families.
type Metrics struct {
	Requests      *prometheus.CounterVec   // op, status
	Latency       *prometheus.HistogramVec // op
	BytesIn       prometheus.Counter
	BytesOut      prometheus.Counter
	Connections   prometheus.Gauge
	ConnsAccepted prometheus.Counter
	ConnsRejected *prometheus.CounterVec // reason
	FramesInvalid *prometheus.CounterVec // reason
	reqCache      [fb.OpSgGet + 1][fb.StatusBufferTooSmall + 1]prometheus.Counter
	latCache      [fb.OpSgGet + 1]prometheus.Observer
}

// NewMetrics registers the server families (and an engine collector) on reg.
func NewMetrics(reg prometheus.Registerer, engine store.Engine) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dfkv_server_requests_total", Help: "Requests served, by op and status (batch items count once per item).",
		}, []string{"op", "status"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dfkv_server_request_duration_seconds", Help: "Time from a request's prefix to its reply being written.",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2.5, 14),
		}, []string{"op"}),
		BytesIn:       prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_server_received_bytes_total", Help: "Value bytes received in PUT-like requests."}),
		BytesOut:      prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_server_sent_bytes_total", Help: "Value bytes sent in GET-like replies."}),
		Connections:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "dfkv_server_connections", Help: "Open data-plane connections."}),
		ConnsAccepted: prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_server_connections_accepted_total", Help: "Data-plane connections accepted."}),
		ConnsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dfkv_server_connections_rejected_total", Help: "Connections closed by a listener protection.",
		}, []string{"reason"}),
		FramesInvalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dfkv_server_invalid_frames_total", Help: "Frames refused, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.Requests, m.Latency, m.BytesIn, m.BytesOut, m.Connections, m.ConnsAccepted, m.ConnsRejected, m.FramesInvalid)
	if engine != nil {
		reg.MustRegister(NewEngineCollector(engine))
		if t, ok := store.Find[store.RAMTier](engine); ok {
			reg.MustRegister(newRAMCollector(t))
		}
		if c, ok := store.Find[store.Coalescer](engine); ok && c.Coalescing() {
			reg.MustRegister(newCoalesceCollector(c))
		}
		if l, ok := store.Find[store.Leaser](engine); ok {
			reg.MustRegister(newLeaseCollector(l))
		}
		if q, ok := store.Find[store.QuotaReporter](engine); ok {
			reg.MustRegister(newQuotaCollector(q))
		}
	}
	// Pre-bind the hot (op, status) children so a request costs no label lookup; statuses a
	// server never sends stay unbound, which also keeps them out of /metrics.
	for op := fb.OpPing; int(op) < len(m.reqCache); op++ {
		name := opName(op)
		m.latCache[op] = m.Latency.WithLabelValues(name)
		for st := fb.StatusOk; st <= fb.StatusInvalid; st++ {
			m.reqCache[op][st] = m.Requests.WithLabelValues(name, statusName(st))
		}
	}
	return m
}

func (m *Metrics) request(op fb.Op, st fb.Status) {
	if int(op) < len(m.reqCache) && int(st) < len(m.reqCache[op]) && m.reqCache[op][st] != nil {
		m.reqCache[op][st].Inc()
		return
	}
	m.Requests.WithLabelValues(opName(op), statusName(st)).Inc()
}

func (m *Metrics) observe(op fb.Op, seconds float64) {
	if int(op) < len(m.latCache) && m.latCache[op] != nil {
		m.latCache[op].Observe(seconds)
	}
}

func opName(op fb.Op) string {
	if n, ok := fb.EnumNamesOp[op]; ok {
		return n
	}
	return "Unknown"
}

func statusName(s fb.Status) string {
	if n, ok := fb.EnumNamesStatus[s]; ok {
		return n
	}
	return "Unknown"
}

// EngineCollector exports store.Stats as dfkv_store_* families at scrape time.
type EngineCollector struct {
	engine store.Engine
	descs  map[string]*prometheus.Desc
}

// NewEngineCollector wraps an engine.
func NewEngineCollector(e store.Engine) *EngineCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"engine"}, nil)
	}
	return &EngineCollector{engine: e, descs: map[string]*prometheus.Desc{
		"objects":   d("dfkv_store_objects", "Values stored."),
		"used":      d("dfkv_store_used_bytes", "Bytes charged against capacity."),
		"capacity":  d("dfkv_store_capacity_bytes", "Configured capacity."),
		"evictions": d("dfkv_store_evictions_total", "Values evicted to make room."),
		"evicted":   d("dfkv_store_evicted_bytes_total", "Bytes evicted."),
		"corrupt":   d("dfkv_store_corrupt_reads_total", "Reads that failed checksum verification (served as misses)."),
		"readb":     d("dfkv_store_read_bytes_total", "Payload bytes read from devices."),
		"writeb":    d("dfkv_store_written_bytes_total", "Payload bytes written to devices."),
		"reads":     d("dfkv_store_reads_total", "Device reads."),
		"writes":    d("dfkv_store_writes_total", "Device writes."),
		"ioerr":     d("dfkv_store_io_errors_total", "Device I/O errors."),
		"healthy":   d("dfkv_store_healthy", "1 when the engine can serve."),
	}}
}

// Describe implements prometheus.Collector.
func (c *EngineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *EngineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.engine.Stats()
	g := func(k string, v int64) {
		ch <- prometheus.MustNewConstMetric(c.descs[k], prometheus.GaugeValue, float64(v), s.Engine)
	}
	ctr := func(k string, v int64) {
		ch <- prometheus.MustNewConstMetric(c.descs[k], prometheus.CounterValue, float64(v), s.Engine)
	}
	g("objects", s.Objects)
	g("used", s.UsedBytes)
	g("capacity", s.CapacityBytes)
	ctr("evictions", s.Evictions)
	ctr("evicted", s.EvictedBytes)
	ctr("corrupt", s.CorruptReads)
	ctr("readb", s.ReadBytes)
	ctr("writeb", s.WriteBytes)
	ctr("reads", s.Reads)
	ctr("writes", s.Writes)
	ctr("ioerr", s.IOErrors)
	h := int64(0)
	if s.Healthy {
		h = 1
	}
	g("healthy", h)
}
