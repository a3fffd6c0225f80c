package notify

import "sync/atomic"

// Metrics count one device's (or one process's) notifications.
type Metrics struct {
	Sends                atomic.Int64 // native notifications submitted (Send returned nil)
	Recvs                atomic.Int64 // native notifications delivered to a handler
	Fallbacks            atomic.Int64 // notifications sent over the bootstrap TCP connection
	Drops                atomic.Int64 // completions dropped: old generation or endpoint gone
	SendErrors           atomic.Int64 // sends that failed after or at submission (never replayed)
	BackpressureWaits    atomic.Int64 // sends that waited for a credit or a send buffer
	BackpressureTimeouts atomic.Int64 // sends that gave up waiting (ErrBackpressure)
	CapacityFailures     atomic.Int64 // endpoints refused: CQ entries or buffer budget exhausted
	CreditMsgs           atomic.Int64 // credit-only messages sent
	CQGrowths            atomic.Int64 // completion queues added to a hub beyond the first
	CQEntries            atomic.Int64 // completion entries of the hubs' CQs (gauge)
	Endpoints            atomic.Int64 // endpoints open (gauge)
	EndpointReuses       atomic.Int64 // endpoints taken from the idle list (a new QP on kept buffers)
	BufferBytes          atomic.Int64 // registered notification buffer bytes (gauge)
}

// Snapshot returns the metrics by their exported names.
func (m *Metrics) Snapshot() map[string]float64 {
	return map[string]float64{
		"dfkv_rdma_notify_sends_total":                 float64(m.Sends.Load()),
		"dfkv_rdma_notify_recvs_total":                 float64(m.Recvs.Load()),
		"dfkv_rdma_notify_fallbacks_total":             float64(m.Fallbacks.Load()),
		"dfkv_rdma_notify_drops_total":                 float64(m.Drops.Load()),
		"dfkv_rdma_notify_send_errors_total":           float64(m.SendErrors.Load()),
		"dfkv_rdma_notify_backpressure_waits_total":    float64(m.BackpressureWaits.Load()),
		"dfkv_rdma_notify_backpressure_timeouts_total": float64(m.BackpressureTimeouts.Load()),
		"dfkv_rdma_notify_capacity_failures_total":     float64(m.CapacityFailures.Load()),
		"dfkv_rdma_notify_credit_msgs_total":           float64(m.CreditMsgs.Load()),
		"dfkv_rdma_notify_cq_growths_total":            float64(m.CQGrowths.Load()),
		"dfkv_rdma_notify_cq_entries":                  float64(m.CQEntries.Load()),
		"dfkv_rdma_notify_endpoints":                   float64(m.Endpoints.Load()),
		"dfkv_rdma_notify_endpoint_reuses_total":       float64(m.EndpointReuses.Load()),
		"dfkv_rdma_notify_buffer_bytes":                float64(m.BufferBytes.Load()),
	}
}
