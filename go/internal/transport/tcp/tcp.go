package tcp

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport"
)

// SocketBuffer is the SO_SNDBUF/SO_RCVBUF asked for on data connections. Large values move
// faster with a few MiB in flight.
const SocketBuffer = 4 << 20

// Setting SO_RCVBUF or SO_SNDBUF turns the kernel's autotuning of that buffer off, and the
// kernel clamps the request to net.core.rmem_max / wmem_max: 212992 bytes on a stock Linux,
// which would pin a data connection at ~416 KiB where autotuning grows it to tcp_rmem's
// maximum (6 MiB or more). So the buffer is fixed only where the maximum lets all of
// SocketBuffer through; elsewhere the kernel's autotuning is left in charge. Read on the
// first connection, not at start-up.
var bufferPolicy = sync.OnceValues(fixedBuffers)

// fixBuffer reports whether a socket buffer should be set to SocketBuffer, given the
// system's maximum for it (-1: unknown).
func fixBuffer(sysMax int64) bool { return sysMax >= SocketBuffer }

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
	fixRead, fixWrite := bufferPolicy()
	if fixRead {
		_ = c.SetReadBuffer(SocketBuffer)
	}
	if fixWrite {
		_ = c.SetWriteBuffer(SocketBuffer)
	}
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
