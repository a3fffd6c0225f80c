package cabi

import (
	"context"
	"errors"

	"github.com/dfkv/dfkv/go/client"
)

// Status codes of dfkv_last_status (dfkv.h's DFKV_STATUS_*): what a caller branches on,
// where dfkv_last_error is the human-readable reason. The values are part of the ABI: never
// renumber, only add.
const (
	StatusOK             = 0
	StatusNotFound       = 1  // a clean miss
	StatusUnavailable    = 2  // the owner could not be reached (down, refused, no members)
	StatusTimeout        = 3  // the owner did not answer in time
	StatusForbidden      = 4  // the token does not grant the op (or TLS/tenant refused)
	StatusTooLarge       = 5  // the value exceeds the max value size
	StatusBufferTooSmall = 6  // the stored value is longer than the buffer (or not the exact size asked)
	StatusCacheFull      = 7  // the node has no room and could not evict
	StatusQuotaExceeded  = 8  // the tenant's quota is spent
	StatusBusy           = 9  // the node could not take the write in time; retry later
	StatusIOError        = 10 // the node's disk failed the op
	StatusInvalid        = 11 // bad arguments or a request the library or node refuses
	StatusProtocol       = 12 // an answer that breaks the protocol
	StatusClosed         = 13 // NULL, closed or unknown handle
	StatusInternal       = 14 // anything else (a recovered panic included)
	// StatusDirectUnsupported: a GET into registered device memory (DMA-BUF) that cannot be
	// served by RDMA into it (client.ErrDirectUnsupported); never retried over TCP.
	StatusDirectUnsupported = 15
)

// statusOf is checked in order: the first sentinel the error wraps wins. TooLarge comes
// before Invalid (a too-large value wraps both); the transport-level causes (timeout,
// unavailable) come after the server's answers, which are more specific.
var statusOf = []struct {
	err    error
	status int
}{
	{client.ErrNotFound, StatusNotFound},
	{client.ErrDirectUnsupported, StatusDirectUnsupported},
	{client.ErrForbidden, StatusForbidden},
	{client.ErrTooLarge, StatusTooLarge},
	{client.ErrBufferTooSmall, StatusBufferTooSmall},
	{client.ErrCacheFull, StatusCacheFull},
	{client.ErrQuotaExceeded, StatusQuotaExceeded},
	{client.ErrBusy, StatusBusy},
	{client.ErrIO, StatusIOError},
	{client.ErrInvalid, StatusInvalid},
	{errEmptyValue, StatusInvalid},
	{errEmptyBuffer, StatusInvalid},
	{errArgs, StatusInvalid},
	{client.ErrClosed, StatusClosed},
	{client.ErrTimeout, StatusTimeout},
	{context.DeadlineExceeded, StatusTimeout},
	{client.ErrUnavailable, StatusUnavailable},
	{client.ErrNoCompatibleRail, StatusUnavailable},
	{client.ErrProtocol, StatusProtocol},
}

// Status maps a failure to its DFKV_STATUS_* code (StatusOK for nil).
func Status(err error) int {
	if err == nil {
		return StatusOK
	}
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return StatusInternal
}
