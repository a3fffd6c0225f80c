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

	"github.com/dfkv/dfkv/go/internal/transport"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/railset"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// peerConfig is what a peer needs of its client: fixed at New and shared by every peer of
// one client (the peer holds no reference to the Client itself).
type peerConfig struct {
	dialer         transport.Dialer
	connectTimeout time.Duration
	ioTimeout      time.Duration
	cooldown       time.Duration
	poolSize       int
	blockingIO     bool
	hello          wire.Hello // what this client offers in HELLO (token included)
	m              *clientMetrics
	onCool         func(addr string, until time.Time) // Options.OnPeerCooldown
}

// peer is one cache node's connection pool and health state.
type peer struct {
	cfg      *peerConfig
	addr     string
	idle     chan *pconn
	coolTill atomic.Int64 // unix nanos; ops fail fast as ErrUnavailable before it
	fails    atomic.Int32
	limits   atomic.Pointer[wire.Hello]
	mu       sync.Mutex // guards closed
	closed   bool
	rdma     *railset.Peer // RDMA pools towards this node (closed by the client's railset.Set)
}

func newPeer(cfg *peerConfig, addr string) *peer {
	return &peer{cfg: cfg, addr: addr, idle: make(chan *pconn, cfg.poolSize)}
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

	stop func() bool // unregisters the context callback of the request in flight
	intr sync.Mutex  // orders interrupt against end's close
	dead bool        // closed by end: interrupt must not touch it
}

// cooling reports whether the peer is in its post-failure cool-down.
func (p *peer) cooling() bool {
	t := p.coolTill.Load()
	return t != 0 && time.Now().UnixNano() < t
}

// markFailed starts a cool-down: the next ops fail fast until it ends, then one op probes.
func (p *peer) markFailed() {
	p.fails.Add(1)
	until := time.Now().Add(p.cfg.cooldown)
	p.coolTill.Store(until.UnixNano())
	p.cfg.m.cooldowns.Inc()
	p.drain()
	if p.cfg.onCool != nil {
		p.cfg.onCool(p.addr, until)
	}
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
}

// get returns a pooled connection or dials a new one.
func (p *peer) get(ctx context.Context) (*pconn, error) {
	select {
	case pc := <-p.idle:
		pc.reused = true
		return pc, nil
	default:
	}
	return p.dial(ctx, p.cfg.blockingIO)
}

// dial connects and says HELLO; blocking moves the socket off the netpoller
// (Options.BlockingIO). The RDMA bootstrap always wants a net.Conn (blocking false).
func (p *peer) dial(ctx context.Context, blocking bool) (*pconn, error) {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.connectTimeout)
	defer cancel()
	nc, err := p.cfg.dialer.DialContext(dctx, p.addr)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, ctxErr(p.addr, cerr)
		}
		if errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err) {
			return nil, fmt.Errorf("dfkv: connect %s: %w: %w", p.addr, ErrTimeout, err)
		}
		return nil, fmt.Errorf("dfkv: connect %s: %w: %w", p.addr, ErrUnavailable, err)
	}
	p.cfg.m.dials.Inc()
	pc := &pconn{nc: nc}
	if blocking {
		fc, err := blockingConn(nc)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("dfkv: connect %s: %w: %w", p.addr, ErrUnavailable, err)
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
	pc.begin(ctx, p.cfg.ioTimeout)
	err = pc.hello(p)
	if pc.end() {
		return nil, ctxErr(p.addr, ctx.Err())
	}
	if err != nil {
		pc.nc.Close()
		return nil, err
	}
	return pc, nil
}

// hello negotiates the protocol version and learns the server's limits.
func (pc *pconn) hello(p *peer) error {
	local := p.cfg.hello
	body := wire.EncodeHello(local)
	local.Token = "" // not kept in the negotiated state
	req := wire.Request{Op: fb.OpHello, PayloadLen: uint64(len(body))}
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
		return fmt.Errorf("dfkv: hello to %s: %w: %w", p.addr, ErrProtocol, err)
	}
	p.limits.Store(&remote)
	return nil
}

// begin arms pc for one request under ctx: its deadline is the earlier of ctx's and the
// per-request I/O deadline, and a cancellable ctx interrupts blocked I/O (see interrupt).
// It reports whether ctx's deadline is the one in force. end must follow the request.
// A context that can never be cancelled (context.Background) costs nothing more than the
// deadline: no callback is registered and no goroutine is ever started.
func (pc *pconn) begin(ctx context.Context, ioTimeout time.Duration) (ctxBound bool) {
	deadline := time.Now().Add(ioTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxBound = d, true
	}
	_ = pc.nc.SetDeadline(deadline)
	if ctx.Done() != nil {
		pc.stop = context.AfterFunc(ctx, pc.interrupt)
	}
	return ctxBound
}

// end reports whether ctx fired while the request ran (or as it ended). Such a connection
// may have stopped mid-frame: end closes it, and it is never pooled again.
func (pc *pconn) end() (interrupted bool) {
	if pc.stop == nil {
		return false
	}
	stopped := pc.stop()
	pc.stop = nil
	if stopped {
		return false
	}
	// interrupt has started or run: once dead is set it cannot touch the descriptor, so
	// closing it here never lets a shutdown land on a reused descriptor number.
	pc.intr.Lock()
	pc.dead = true
	pc.intr.Unlock()
	pc.nc.Close()
	return true
}

// interrupt wakes a request blocked on pc (ctx cancelled or past its deadline). On the
// netpoller a past deadline does it; a blocking system call (Options.BlockingIO) only
// returns when the socket is shut down.
func (pc *pconn) interrupt() {
	pc.intr.Lock()
	defer pc.intr.Unlock()
	if pc.dead {
		return
	}
	if pc.fd != nil {
		pc.fd.interrupt()
		return
	}
	_ = pc.nc.SetDeadline(time.Unix(1, 0))
}

// ctxErr is the error of a request its context ended: errors.Is finds the context's error
// (and ErrTimeout for a deadline, which callers treat as a miss).
func ctxErr(addr string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("dfkv: %s: %w: %w", addr, ErrTimeout, err)
	}
	return fmt.Errorf("dfkv: %s: %w", addr, err)
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
		return r, fmt.Errorf("%w: %w", ErrProtocol, err)
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
		return fmt.Errorf("dfkv: %s: %w: %w", addr, ErrTimeout, err)
	}
	return fmt.Errorf("dfkv: %s: %w: %w", addr, ErrUnavailable, err)
}

// isStale reports whether a failure on a reused pooled connection looks like the server
// closed it while idle (worth one retry on a fresh connection).
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		isConnReset(err)
}
