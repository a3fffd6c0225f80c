//go:build !linux

package server

import "net"

// newRawConn is the identity where raw socket calls are not implemented.
func newRawConn(nc net.Conn) net.Conn { return nc }
