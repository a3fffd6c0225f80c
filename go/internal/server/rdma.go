package server

import (
	"bufio"
	"context"
	"errors"
	"net"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RDMAServer serves one RDMA connection bootstrapped on a data connection
// (onesided.Server). Serve returns when the RDMA connection ends; ctx ends it early.
type RDMAServer interface {
	Serve(ctx context.Context, boot net.Conn) error
}

// bufConn reads through the connection's buffered reader: bytes the client pipelined after
// the bootstrap request (its DCP offer) may already be buffered there.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

var errRDMASessionEnded = errors.New("rdma session ended")

// rdmaBootstrap hands the connection to the RDMA server. It never returns to the request
// loop: when the RDMA connection ends, so does this TCP connection.
func (c *conn) rdmaBootstrap() error {
	if c.s.cfg.RDMA == nil {
		c.s.m.request(fb.OpRdmaBootstrap, fb.StatusInvalid)
		c.replyStatus(fb.OpRdmaBootstrap, fb.StatusInvalid, 0)
		return nil
	}
	c.s.m.request(fb.OpRdmaBootstrap, fb.StatusOk)
	c.replyStatus(fb.OpRdmaBootstrap, fb.StatusOk, 0)
	if err := c.flush(); err != nil {
		return errConn{err}
	}
	_ = c.nc.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.s.drained:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := c.s.cfg.RDMA.Serve(ctx, bufConn{Conn: c.nc, r: c.br})
	if err != nil {
		c.s.log.Info("rdma connection ended", "remote", c.nc.RemoteAddr(), "err", err)
	}
	return errConn{errRDMASessionEnded}
}
