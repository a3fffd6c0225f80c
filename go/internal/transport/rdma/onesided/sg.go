package onesided

import (
	"sync/atomic"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// SGMetrics watch multi-SGE requests (an op whose caller memory is more than one piece: a
// gathered PUT, a scattered GET) per QP. The client's SG lane (docs/RDMA.md, "SG lane")
// keeps at most one of them in flight on a QP; these series show whether that held.
type SGMetrics struct {
	// Ops: multi-SGE requests posted.
	Ops atomic.Int64
	// InFlightMax: the most multi-SGE requests ever in flight at once on one QP (posted,
	// reply not yet completed), over every connection sharing these metrics.
	InFlightMax atomic.Int64
	// Overlaps: multi-SGE requests posted while another was still in flight on that QP.
	Overlaps atomic.Int64
}

func (m *SGMetrics) add(out map[string]float64) {
	out["dfkv_rdma_sg_ops_total"] = float64(m.Ops.Load())
	out["dfkv_rdma_sg_qp_inflight_max"] = float64(m.InFlightMax.Load())
	out["dfkv_rdma_sg_qp_overlaps_total"] = float64(m.Overlaps.Load())
}

// raise lifts InFlightMax to n.
func (m *SGMetrics) raise(n int64) {
	for {
		cur := m.InFlightMax.Load()
		if n <= cur || m.InFlightMax.CompareAndSwap(cur, n) {
			return
		}
	}
}

// MultiSGE reports whether op's caller memory is more than one non-empty piece (a PUT's
// Value, a GET's Dst): the traffic the SG lane isolates.
func (op *Op) MultiSGE() bool {
	segs := op.Value
	if op.Kind == fb.OpGet {
		segs = op.Dst
	}
	n := 0
	for _, s := range segs {
		if len(s) > 0 {
			n++
		}
	}
	return n > 1
}
