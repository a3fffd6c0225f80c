package client

import (
	"errors"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/railset"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Sentinel errors; callers branch with errors.Is.
var (
	ErrNotFound       = errors.New("dfkv: not found")
	ErrCacheFull      = errors.New("dfkv: cache full")
	ErrQuotaExceeded  = errors.New("dfkv: quota exceeded")
	ErrIO             = errors.New("dfkv: server I/O error")
	ErrInvalid        = errors.New("dfkv: invalid request")
	ErrTimeout        = errors.New("dfkv: timeout")
	ErrUnavailable    = errors.New("dfkv: peer unavailable")
	ErrBufferTooSmall = errors.New("dfkv: buffer too small")
	ErrClosed         = errors.New("dfkv: client closed")
	ErrProtocol       = errors.New("dfkv: protocol error")
	// ErrForbidden: the server runs with tenant tokens and this client's token (Options.Token)
	// is missing, unknown, revoked, or does not grant the op on the client's tenant.
	ErrForbidden = errors.New("dfkv: forbidden")
	// ErrBusy: the node could not take the write fast enough (its write-back dirty budget
	// stayed full for the bounded wait). Nothing was stored; retry later.
	ErrBusy = errors.New("dfkv: node busy")
	// ErrNoCompatibleRail: no RDMA rail this client may use is published healthy by the
	// server (or the client has tiers and the server publishes no rails). Client-local: the
	// op goes over TCP and the peer's health is untouched (docs/RDMA.md §4).
	ErrNoCompatibleRail = railset.ErrNoCompatibleRail
	// ErrTooLarge: a value larger than the client's max value size (Limits.MaxValue). It is
	// reported together with ErrInvalid (errors.Is matches both), as before it existed.
	ErrTooLarge = errors.New("dfkv: value too large")
	// ErrDirectUnsupported: a GET whose destination lies in registered device memory
	// (RegisterDMABuf) cannot be served directly: the owner is not reachable over RDMA, its
	// server does not accept device targets, or the NIC refused the registration. Nothing was
	// written to the destination and nothing falls back to TCP or host staging.
	ErrDirectUnsupported = railset.ErrDirectUnsupported
)

func statusErr(st fb.Status) error {
	switch st {
	case fb.StatusOk:
		return nil
	case fb.StatusNotFound:
		return ErrNotFound
	case fb.StatusCacheFull:
		return ErrCacheFull
	case fb.StatusQuotaExceeded:
		return ErrQuotaExceeded
	case fb.StatusIOError:
		return ErrIO
	case fb.StatusInvalid:
		return ErrInvalid
	case fb.StatusTimeout:
		return ErrTimeout
	case fb.StatusUnavailable:
		return ErrUnavailable
	case fb.StatusBufferTooSmall:
		return ErrBufferTooSmall
	case fb.StatusForbidden:
		return ErrForbidden
	case fb.StatusBusy:
		return ErrBusy
	default:
		return ErrProtocol
	}
}

// IsMiss reports whether err means "the cache does not have it now": the caller recomputes.
func IsMiss(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrTimeout) ||
		errors.Is(err, ErrBufferTooSmall)
}
