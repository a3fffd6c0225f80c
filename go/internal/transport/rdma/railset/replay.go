package railset

import (
	"errors"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// The replay contract (docs/RDMA.md §4, "Replay contract"): after a rail breaks, the
// unfinished reads (GET, EXIST) run again on another rail, and so do writes (PUT, REMOVE)
// that are known not to have been submitted (their request WR never reached the QP:
// onesided.Op.Posted is false). A write that may have been submitted is ambiguous (it may
// have run on the server): it is returned as an error, never replayed, because running it
// again could reorder it after a newer write of the same key from another client.

// splitReplay returns the unfinished ops that may run again and how many may not.
func splitReplay(unfinished []*onesided.Op) (replay []*onesided.Op, ambiguous int) {
	for _, o := range unfinished {
		switch {
		case o.Kind == fb.OpGet || o.Kind == fb.OpExist:
			replay = append(replay, o)
		case !o.Posted:
			replay = append(replay, o)
		default:
			ambiguous++
		}
	}
	return replay, ambiguous
}

// railAccount adds one window's outcome to rail's series: the value bytes of completed
// ops, the stale completions its connection dropped, a completion error that broke it.
func (s *Set) railAccount(rail string, oc *onesided.Client, ops []*onesided.Op, stale0 int64, derr error) {
	rm := s.rm
	var n uint64
	for _, o := range ops {
		if o.Status != fb.StatusOk {
			continue
		}
		switch o.Kind {
		case fb.OpPut:
			n += segsLen(o.Value)
		case fb.OpGet:
			n += uint64(o.N)
		}
	}
	if n > 0 {
		rm.bytes.WithLabelValues(rail).Add(float64(n))
	}
	if d := oc.StaleDropped() - stale0; d > 0 {
		rm.stale.WithLabelValues(rail).Add(float64(d))
	}
	var ce *verbs.CompletionError
	if derr != nil && errors.As(derr, &ce) {
		rm.compErrors.WithLabelValues(rail).Inc()
	}
}

func segsLen(segs [][]byte) uint64 {
	var n uint64
	for _, s := range segs {
		n += uint64(len(s))
	}
	return n
}
