package wire

import (
	"fmt"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Limits bound every frame a peer may send. The zero value is not usable; start from
// DefaultLimits.
type Limits struct {
	MaxValue      uint64 // largest stored value
	MaxBatchItems uint32 // items in one batch frame
	MaxControl    uint64 // control-table payload (Hello, Stats)
	MaxFrame      uint64 // total payload of one frame (batch puts); beyond it the stream is dropped
	MaxSgSegs     uint32 // segments in one scatter-gather op
}

// DefaultLimits are the protocol defaults (SPEC §4).
func DefaultLimits() Limits {
	return Limits{
		MaxValue:      64 << 20,
		MaxBatchItems: 4096,
		MaxControl:    64 << 10,
		MaxFrame:      1 << 30,
		MaxSgSegs:     256,
	}
}

// Validate rejects inconsistent limits.
func (l Limits) Validate() error {
	switch {
	case l.MaxValue == 0 || l.MaxValue > 1<<32:
		return fmt.Errorf("wire: max value %d out of range 1..4GiB", l.MaxValue)
	case l.MaxBatchItems == 0:
		return fmt.Errorf("wire: max batch items must be positive")
	case l.MaxControl < 1024:
		return fmt.Errorf("wire: max control payload %d below 1KiB", l.MaxControl)
	case l.MaxFrame < l.MaxValue+RequestSize:
		return fmt.Errorf("wire: max frame %d smaller than max value %d", l.MaxFrame, l.MaxValue)
	case l.MaxSgSegs == 0:
		return fmt.Errorf("wire: max sg segments must be positive")
	}
	return nil
}

// FrameError says why a request was refused and whether the stream is still in sync: when
// Resync is true the receiver may skip PayloadLen bytes, answer Invalid and go on; otherwise
// it must answer Invalid (best effort) and close the connection.
type FrameError struct {
	Err    error
	Resync bool
}

func (e *FrameError) Error() string { return e.Err.Error() }
func (e *FrameError) Unwrap() error { return e.Err }

// Check validates a decoded request against the limits.
func (l Limits) Check(r *Request) error {
	bad := func(err error, format string, args ...any) error {
		return &FrameError{Err: fmt.Errorf("%w: op %d: "+format, append([]any{err, r.Op}, args...)...), Resync: r.PayloadLen <= l.MaxFrame}
	}
	if r.PayloadLen > l.MaxFrame {
		return bad(ErrLimit, "payload %d > frame cap %d", r.PayloadLen, l.MaxFrame)
	}
	if r.Flags&^knownFlags != 0 {
		return bad(ErrMalformed, "unknown flags %#x", r.Flags)
	}
	if r.Flags&FlagReplica != 0 && r.Op != fb.OpPut && r.Op != fb.OpGet && r.Op != fb.OpRemove {
		return bad(ErrMalformed, "replica flag on op %d", r.Op)
	}
	switch r.Op {
	case fb.OpPing, fb.OpRdmaBootstrap:
		if r.PayloadLen != 0 {
			return bad(ErrMalformed, "op without payload carries %d bytes", r.PayloadLen)
		}
	case fb.OpHello, fb.OpStats:
		if r.PayloadLen > l.MaxControl {
			return bad(ErrLimit, "control payload %d > %d", r.PayloadLen, l.MaxControl)
		}
	case fb.OpPut:
		if r.PayloadLen == 0 {
			return bad(ErrMalformed, "empty value")
		}
		if r.PayloadLen > l.MaxValue {
			return bad(ErrLimit, "value %d > max %d", r.PayloadLen, l.MaxValue)
		}
	case fb.OpGet, fb.OpExist, fb.OpRemove:
		if r.PayloadLen != 0 {
			return bad(ErrMalformed, "unexpected payload %d", r.PayloadLen)
		}
		if r.Op == fb.OpGet && r.Flags&(FlagExact|FlagCap) == FlagExact|FlagCap {
			return bad(ErrMalformed, "exact and cap flags together")
		}
	case fb.OpSgPut, fb.OpSgGet:
		if r.Count == 0 || r.Count > l.MaxSgSegs {
			return bad(ErrLimit, "sg segments %d not in 1..%d", r.Count, l.MaxSgSegs)
		}
		pre := uint64(r.Count) * SgSegSize
		if r.Op == fb.OpSgGet && r.PayloadLen != pre {
			return bad(ErrMalformed, "sg get payload %d != %d", r.PayloadLen, pre)
		}
		if r.Op == fb.OpSgPut && (r.PayloadLen <= pre || r.PayloadLen-pre > l.MaxValue) {
			return bad(ErrLimit, "sg put payload %d (segments %d, max value %d)", r.PayloadLen, r.Count, l.MaxValue)
		}
	case fb.OpBatchPut:
		if r.Count == 0 || r.Count > l.MaxBatchItems {
			return bad(ErrLimit, "batch items %d not in 1..%d", r.Count, l.MaxBatchItems)
		}
		if r.PayloadLen < uint64(r.Count)*(BatchItemSize+1) {
			return bad(ErrMalformed, "batch put payload %d too short for %d items", r.PayloadLen, r.Count)
		}
	case fb.OpBatchGet, fb.OpBatchExist, fb.OpBatchRemove, fb.OpBatchExistLease:
		if r.Count == 0 || r.Count > l.MaxBatchItems {
			return bad(ErrLimit, "batch items %d not in 1..%d", r.Count, l.MaxBatchItems)
		}
		if r.PayloadLen != uint64(r.Count)*BatchItemSize {
			return bad(ErrMalformed, "batch payload %d != %d items", r.PayloadLen, r.Count)
		}
	case fb.OpTag:
		if r.PayloadLen == 0 || r.PayloadLen > MaxTagPayload {
			return bad(ErrLimit, "tag payload %d not in 1..%d", r.PayloadLen, MaxTagPayload)
		}
	default:
		return bad(ErrUnknownOp, "unknown")
	}
	return nil
}
