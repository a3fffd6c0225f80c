package transport

import (
	"context"
	"net"
)

// Listener accepts inbound data-plane connections.
type Listener interface {
	Accept() (net.Conn, error)
	Close() error
	Addr() net.Addr
}

// Dialer opens outbound data-plane connections.
type Dialer interface {
	// DialContext connects to addr ("host:port"); ctx bounds the connect.
	DialContext(ctx context.Context, addr string) (net.Conn, error)
	// Mode names the transport ("tcp", "rdma").
	Mode() string
}
