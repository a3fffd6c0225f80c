package client

import (
	"bytes"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

type opKind int

const (
	opPut opKind = iota
	opGet
	opExist
	opRemove
	opBatchPut
	opBatchGet
	opBatchExist
	opBatchRemove
	numOps
)

var opNames = [numOps]string{"put", "get", "exist", "remove", "batch_put", "batch_get", "batch_exist", "batch_remove"}

const (
	resOK = iota
	resMiss
	resError
	numRes
)

var resNames = [numRes]string{"ok", "miss", "error"}

// clientMetrics is a per-client registry rendered by Snapshot (dfkv_stats_snapshot).
type clientMetrics struct {
	reg       *prometheus.Registry
	ops       [numOps][numRes]prometheus.Counter
	bytes     [numOps]prometheus.Counter
	latency   [numOps]prometheus.Observer
	retries   prometheus.Counter
	dials     prometheus.Counter
	cooldowns prometheus.Counter
	fastFails prometheus.Counter
	// hotReads: reads sent to a hot key's replica, by result (hit, fallback).
	hotReads *prometheus.CounterVec
	// directLoads: GETs (batch items one by one) into registered device memory, by result
	// (ok; miss: the server has no such value, or none that fits; error: the load failed,
	// e.g. its connection broke or it timed out; refused: not possible on this path,
	// ErrDirectUnsupported);
	// directSeconds: a scalar direct GET's call time (the RDMA transfer alone is
	// dfkv_rdma_direct_transfer_seconds_total).
	directLoads   *prometheus.CounterVec
	directSeconds prometheus.Histogram
}

func newClientMetrics() *clientMetrics {
	m := &clientMetrics{reg: prometheus.NewRegistry()}
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_client_ops_total", Help: "Client operations (batch items count individually) by op and result."}, []string{"op", "result"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_client_value_bytes_total", Help: "Value bytes moved by op."}, []string{"op"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dfkv_client_op_duration_seconds", Help: "Call latency (a batch call is one observation).",
		Buckets: prometheus.ExponentialBuckets(20e-6, 2.5, 14)}, []string{"op"})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_stale_retries_total", Help: "Requests replayed once on a fresh connection after a stale pooled one failed."})
	m.dials = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_dials_total", Help: "Connections opened."})
	m.cooldowns = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_peer_cooldowns_total", Help: "Peer cool-downs started after I/O failures."})
	m.fastFails = prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_client_fast_fails_total", Help: "Requests failed at once because their peer was cooling down."})
	m.hotReads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_client_hot_replica_reads_total",
		Help: "Reads of hot keys sent to a replica, by result (hit; fallback: missed or failed there and read from the primary)."}, []string{"result"})
	m.directLoads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dfkv_client_direct_loads_total",
		Help: "GETs into registered device memory (DMA-BUF), by result (ok; miss: no such value, or too large; error: the load failed; refused: not possible directly)."}, []string{"result"})
	m.directSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dfkv_client_direct_load_seconds",
		Help: "Call time of a scalar GET into device memory.", Buckets: prometheus.ExponentialBuckets(20e-6, 2.5, 14)})
	m.reg.MustRegister(ops, bytes, lat, m.retries, m.dials, m.cooldowns, m.fastFails, m.hotReads, m.directLoads, m.directSeconds)
	for o := range numOps {
		for r := range numRes {
			m.ops[o][r] = ops.WithLabelValues(opNames[o], resNames[r])
		}
		m.bytes[o] = bytes.WithLabelValues(opNames[o])
		m.latency[o] = lat.WithLabelValues(opNames[o])
	}
	return m
}

func result(err error) int {
	switch {
	case err == nil:
		return resOK
	case IsMiss(err) || errors.Is(err, ErrNotFound):
		return resMiss
	default:
		return resError
	}
}

func (m *clientMetrics) done(op opKind, err error, n int64, start time.Time) {
	m.ops[op][result(err)].Inc()
	if err == nil && n > 0 {
		m.bytes[op].Add(float64(n))
	}
	m.latency[op].Observe(time.Since(start).Seconds())
}

// directDone counts one direct load's outcome. Unlike dfkv_client_ops_total, a load that
// failed on its way (unavailable, timed out) is an error, not a miss: the value exists, the
// transfer into device memory did not complete.
func (m *clientMetrics) directDone(err error) {
	r := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrDirectUnsupported):
		r = "refused"
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrBufferTooSmall):
		r = "miss"
	default:
		r = "error"
	}
	m.directLoads.WithLabelValues(r).Inc()
}

// Snapshot renders the client's metrics in the Prometheus text format.
func (c *Client) Snapshot() []byte {
	mfs, err := c.m.reg.Gather()
	if err != nil {
		return nil
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		_ = enc.Encode(mf)
	}
	return buf.Bytes()
}
