package client

import (
	"errors"
	"syscall"
)

// isConnReset reports a connection the peer reset or closed under us. Portable: ECONNRESET
// and EPIPE exist on every platform Go supports.
func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
