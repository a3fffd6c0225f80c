package tcp

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport"
)

// SocketBuffer is the SO_SNDBUF/SO_RCVBUF asked for on data connections. Large values move
// faster with a few MiB in flight; the kernel clamps to its configured maximum.
const SocketBuffer = 4 << 20

// Listen opens a TCP listener on addr.
func Listen(addr string) (transport.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w", addr, err)
	}
	return &listener{ln.(*net.TCPListener)}, nil
}

type listener struct{ *net.TCPListener }

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	tune(c)
	return c, nil
}

func tune(c *net.TCPConn) {
	_ = c.SetNoDelay(true)
	_ = c.SetKeepAlive(true)
	_ = c.SetKeepAlivePeriod(30 * time.Second)
	_ = c.SetReadBuffer(SocketBuffer)
	_ = c.SetWriteBuffer(SocketBuffer)
}

// Dialer dials TCP connections.
type Dialer struct{}

// DialContext connects to addr.
func (Dialer) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tune(c.(*net.TCPConn))
	return c, nil
}

// Mode returns "tcp".
func (Dialer) Mode() string { return "tcp" }
