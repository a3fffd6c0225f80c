package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// peer is one cache node's connection pool and health state.
type peer struct {
	c        *Client
	addr     string
	idle     chan *pconn
	coolTill atomic.Int64 // unix nanos; ops fail fast as ErrUnavailable before it
	fails    atomic.Int32
	limits   atomic.Pointer[wire.Hello]
	mu       sync.Mutex // guards closed
	closed   bool
	rdma     peerRDMA
}

func newPeer(c *Client, addr string) *peer {
	return &peer{c: c, addr: addr, idle: make(chan *pconn, c.opts.PoolSize)}
}

// stream is what a pooled connection needs of its transport: a net.Conn, or an fdConn
// doing blocking I/O on the caller's thread (Options.BlockingIO).
type stream interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// pconn is one pooled connection.
type pconn struct {
	nc      stream
	fd      *fdConn // nc when it is blocking I/O; nil on the netpoller path
	br      *bufio.Reader
	hdr     [wire.RequestSize]byte
	scratch []byte
	bufs    net.Buffers
	reused  bool
}

// cooling reports whether the peer is in its post-failure cool-down.
func (p *peer) cooling() bool {
	t := p.coolTill.Load()
	return t != 0 && time.Now().UnixNano() < t
}

// markFailed starts a cool-down: the next ops fail fast until it ends, then one op probes.
func (p *peer) markFailed() {
	p.fails.Add(1)
	p.coolTill.Store(time.Now().Add(p.c.opts.Cooldown).UnixNano())
	p.c.m.cooldowns.Inc()
	p.drain()
}

func (p *peer) markHealthy() {
	if p.coolTill.Load() != 0 {
		p.coolTill.Store(0)
	}
	p.fails.Store(0)
}

// drain closes every idle connection (after a failure they are suspect).
func (p *peer) drain() {
	for {
		select {
		case pc := <-p.idle:
			pc.nc.Close()
		default:
			return
		}
	}
}

func (p *peer) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.drain()
	p.rdma.close()
}

// get returns a pooled connection or dials a new one.
func (p *peer) get() (*pconn, error) {
	select {
	case pc := <-p.idle:
		pc.reused = true
		return pc, nil
	default:
	}
	return p.dial()
}

func (p *peer) dial() (*pconn, error) { return p.dialWith(p.c.opts.BlockingIO) }

// dialWith connects and says HELLO; blocking moves the socket off the netpoller
// (Options.BlockingIO). The RDMA bootstrap always wants a net.Conn (blocking false).
func (p *peer) dialWith(blocking bool) (*pconn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.c.opts.ConnectTimeout)
	defer cancel()
	nc, err := p.c.opts.Dialer.DialContext(ctx, p.addr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err) {
			return nil, fmt.Errorf("dfkv: connect %s: %w", p.addr, ErrTimeout)
		}
		return nil, fmt.Errorf("dfkv: connect %s: %w: %v", p.addr, ErrUnavailable, err)
	}
	p.c.m.dials.Inc()
	pc := &pconn{nc: nc}
	if blocking {
		fc, err := blockingConn(nc)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("dfkv: connect %s: %w: %v", p.addr, ErrUnavailable, err)
		}
		if fc != nil {
			pc.nc, pc.fd = fc, fc
		}
	}
	if pc.fd != nil {
		// Small: a reply header and a small value arrive in one recv, while most of a large
		// value bypasses it (readSegsDirect) instead of being copied through it.
		pc.br = bufio.NewReaderSize(pc.nc, 16<<10)
	} else {
		pc.br = bufio.NewReaderSize(pc.nc, 64<<10)
	}
	if err := pc.hello(p); err != nil {
		pc.nc.Close()
		return nil, err
	}
	return pc, nil
}

// hello negotiates the protocol version and learns the server's limits.
func (pc *pconn) hello(p *peer) error {
	local := wire.Hello{ProtocolVersion: uint32(wire.ProtocolVersion), MinProtocolVersion: uint32(wire.ProtocolVersion),
		MaxValueBytes: p.c.opts.Limits.MaxValue, MaxBatchItems: p.c.opts.Limits.MaxBatchItems, MaxDepth: 1,
		SoftwareVersion: Version, Transport: p.c.opts.Dialer.Mode()}
	local.Token = p.c.opts.Token
	body := wire.EncodeHello(local)
	local.Token = "" // not kept in the negotiated state
	req := wire.Request{Op: fb.OpHello, PayloadLen: uint64(len(body))}
	_ = pc.nc.SetDeadline(time.Now().Add(p.c.opts.IOTimeout))
	if err := pc.send(&req, body); err != nil {
		return ioErr(p.addr, err)
	}
	resp, err := pc.recv(fb.OpHello)
	if err != nil {
		return ioErr(p.addr, err)
	}
	if resp.Status == fb.StatusForbidden {
		return statusError{fmt.Errorf("dfkv: hello to %s: token refused: %w", p.addr, ErrForbidden)}
	}
	if resp.Status != fb.StatusOk || resp.PayloadLen > 64<<10 {
		return fmt.Errorf("dfkv: hello to %s refused (status %d): %w", p.addr, resp.Status, ErrProtocol)
	}
	buf := make([]byte, resp.PayloadLen)
	if _, err := io.ReadFull(pc.br, buf); err != nil {
		return ioErr(p.addr, err)
	}
	remote, err := wire.DecodeHello(buf)
	if err == nil {
		_, err = wire.Negotiate(local, remote)
	}
	if err != nil {
		return fmt.Errorf("dfkv: hello to %s: %w: %v", p.addr, ErrProtocol, err)
	}
	p.limits.Store(&remote)
	return nil
}

// put returns a healthy connection to the pool.
func (p *peer) put(pc *pconn) {
	pc.reused = false
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		pc.nc.Close()
		return
	}
	select {
	case p.idle <- pc:
	default:
		pc.nc.Close()
	}
}

// send writes a request prefix followed by payload segments in one writev.
func (pc *pconn) send(r *wire.Request, payload ...[]byte) error {
	r.Encode(pc.hdr[:])
	if pc.fd != nil {
		pc.bufs = append(pc.bufs[:0], pc.hdr[:])
		pc.bufs = append(pc.bufs, payload...)
		err := pc.fd.writev(pc.bufs)
		clear(pc.bufs)
		return err
	}
	if len(payload) == 0 {
		_, err := pc.nc.Write(pc.hdr[:])
		return err
	}
	pc.bufs = append(pc.bufs[:0], pc.hdr[:])
	pc.bufs = append(pc.bufs, payload...)
	bufs := pc.bufs
	_, err := bufs.WriteTo(pc.nc)
	clear(pc.bufs)
	return err
}

// recv reads a response prefix and checks that it answers op.
func (pc *pconn) recv(op fb.Op) (wire.Response, error) {
	var b [wire.ResponseSize]byte
	if _, err := io.ReadFull(pc.br, b[:]); err != nil {
		return wire.Response{}, err
	}
	r, err := wire.DecodeResponse(b[:])
	if err != nil {
		return r, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if r.Op != op {
		return r, fmt.Errorf("%w: reply to op %d for op %d", ErrProtocol, r.Op, op)
	}
	return r, nil
}

// ioErr classifies a transport failure.
func ioErr(addr string, err error) error {
	if errors.Is(err, ErrProtocol) {
		return fmt.Errorf("dfkv: %s: %w", addr, err)
	}
	if os.IsTimeout(err) {
		return fmt.Errorf("dfkv: %s: %w: %v", addr, ErrTimeout, err)
	}
	return fmt.Errorf("dfkv: %s: %w: %v", addr, ErrUnavailable, err)
}

// isStale reports whether a failure on a reused pooled connection looks like the server
// closed it while idle (worth one retry on a fresh connection).
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		isConnReset(err)
}
