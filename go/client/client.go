package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/transport"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/railset"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
	"github.com/dfkv/dfkv/go/internal/version"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Version is the client library version.
var Version = version.Version

// Options configure a Client. Zero values take the defaults noted.
type Options struct {
	Membership       Membership // required
	Namespace        []byte     // binary namespace (may contain NUL)
	Tenant           []byte     // tenant for quotas; its hash travels on the wire
	Dialer           transport.Dialer
	ConnectTimeout   time.Duration // default 1s
	IOTimeout        time.Duration // per request, default 5s
	Cooldown         time.Duration // after a peer I/O failure, default 3s
	PoolSize         int           // idle connections kept per peer, default 16
	BatchConcurrency int           // chunks in flight per batch call, default 4
	Limits           wire.Limits   // client-side frame limits, default wire.DefaultLimits()
	Logger           *slog.Logger
	// TLS, when set, dials every node with TLS 1.3 over Dialer, checking the node's
	// certificate against the host of its advertised address (see TLSFromFiles).
	TLS *tls.Config
	// Token is the tenant token sent in HELLO to nodes that run with --auth-tokens.
	Token string
	// BlockingIO does each request's socket I/O as blocking system calls on the calling
	// thread, reading values straight into the caller's buffers (recvmsg, MSG_WAITALL),
	// instead of through the Go netpoller. It is for callers that enter Go from foreign
	// threads (the C ABI), where every netpoller wait costs a thread handoff; Go callers
	// are better served by the netpoller. Linux, kernel-socket transports only (others
	// ignore it). Deadlines, retries and the cool-down behave the same.
	BlockingIO bool
	RDMA       *RDMAOptions // nil = TCP only
	// FanoutThreads bounds the goroutines one client runs for the chunks of its batch calls
	// beyond the first (default 32, at most 4096). The C ABI sets it from DFKV_FANOUT_THREADS.
	FanoutThreads int
	// OnPeerCooldown, when set, is called each time a member's cool-down starts (after an
	// I/O failure), with the time it ends; the C ABI drops its detached sockets to the
	// member then (see DialDetached). It must not block.
	OnPeerCooldown func(addr string, until time.Time)
	// NoHotSpread reads hot keys from their primary only, ignoring the replicas primaries
	// advertise (docs/ARCHITECTURE.md "Hot objects"). Spreading needs TCP (RDMA clients
	// never spread).
	NoHotSpread bool
}

// Client is safe for concurrent use.
type Client struct {
	opts   Options
	tenant uint64
	m      *clientMetrics
	pcfg   *peerConfig
	fanout chan struct{} // batch chunk goroutines in flight (Options.FanoutThreads)
	hot    *hotTable

	mu     sync.RWMutex
	peers  map[string]*peer // by address
	closed atomic.Bool
	rdma   *railset.Set // RDMA transport: rail policy, pools (without RDMA: RegisterMemory's ranges)
}

// New returns a client. It does not connect until the first request.
func New(opts Options) (*Client, error) {
	if opts.Membership == nil {
		return nil, errors.New("dfkv: no membership (static members or MDS endpoints)")
	}
	if opts.Dialer == nil {
		opts.Dialer = tcp.Dialer{}
	}
	if opts.TLS != nil {
		cfg := opts.TLS
		opts.Dialer = secure.Dialer{Inner: opts.Dialer, Config: func() *tls.Config { return cfg }}
	}
	if len(opts.Token) > wire.MaxTokenLen {
		return nil, fmt.Errorf("dfkv: token longer than %d bytes: %w", wire.MaxTokenLen, ErrInvalid)
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = time.Second
	}
	if opts.IOTimeout <= 0 {
		opts.IOTimeout = 5 * time.Second
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = 3 * time.Second
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 16
	}
	if opts.BatchConcurrency <= 0 {
		opts.BatchConcurrency = 4
	}
	if opts.FanoutThreads <= 0 {
		opts.FanoutThreads = 32
	}
	if opts.FanoutThreads > 4096 {
		return nil, fmt.Errorf("dfkv: %d fan-out threads (at most 4096): %w", opts.FanoutThreads, ErrInvalid)
	}
	if opts.Limits == (wire.Limits{}) {
		opts.Limits = wire.DefaultLimits()
	}
	if err := opts.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("dfkv: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Namespace = append([]byte(nil), opts.Namespace...)
	c := &Client{opts: opts, tenant: identity.Tenant(opts.Tenant), m: newClientMetrics(), peers: map[string]*peer{},
		fanout: make(chan struct{}, opts.FanoutThreads), hot: newHotTable()}
	c.pcfg = &peerConfig{dialer: opts.Dialer, connectTimeout: opts.ConnectTimeout, ioTimeout: opts.IOTimeout,
		cooldown: opts.Cooldown, poolSize: opts.PoolSize, blockingIO: opts.BlockingIO, m: c.m, onCool: opts.OnPeerCooldown,
		hello: wire.Hello{ProtocolVersion: uint32(wire.ProtocolVersion), MinProtocolVersion: uint32(wire.ProtocolVersion),
			MaxValueBytes: opts.Limits.MaxValue, MaxBatchItems: opts.Limits.MaxBatchItems, MaxDepth: 1,
			SoftwareVersion: Version, Transport: opts.Dialer.Mode(), Token: opts.Token}}
	// A membership with its own metrics (MDS discovery) shows up in this client's snapshot.
	if col, ok := opts.Membership.(prometheus.Collector); ok {
		_ = c.m.reg.Register(col)
	}
	if opts.RDMA != nil {
		if g := opts.RDMA.GIDIndex; g != nil && (*g < 0 || *g > verbs.MaxGIDIndex) {
			return nil, fmt.Errorf("%w: RDMA GID index %d (0..%d)", ErrInvalid, *g, verbs.MaxGIDIndex)
		}
	}
	rs, err := c.newRailSet()
	if err != nil {
		return nil, err
	}
	c.rdma = rs
	return c, nil
}

// View returns the routing snapshot the client currently uses.
func (c *Client) View() *View { return c.opts.Membership.View() }

// Close releases pooled connections. Requests after Close fail with ErrClosed.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.rdma.Close() // probes and janitor, then RDMA connections, then the devices
	c.mu.Lock()
	for _, p := range c.peers {
		p.close()
	}
	c.mu.Unlock()
	return c.opts.Membership.Close()
}

// MaxSGSegs is the most segments one scatter-gather item may have.
func (c *Client) MaxSGSegs() int { return int(c.opts.Limits.MaxSgSegs) }

// ID returns the object id of key in this client's namespace.
func (c *Client) ID(key []byte) identity.ObjectID { return identity.Object(c.opts.Namespace, key) }

func (c *Client) peerFor(m Member) *peer {
	c.mu.RLock()
	p := c.peers[m.Addr]
	c.mu.RUnlock()
	if p != nil {
		return p
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p = c.peers[m.Addr]; p == nil {
		p = newPeer(c.pcfg, m.Addr)
		p.rdma = c.rdma.NewPeer(rdmaHost{p})
		c.peers[m.Addr] = p
	}
	return p
}

// route returns the peer owning id, or ErrUnavailable when it is cooling down.
func (c *Client) route(id identity.ObjectID) (*peer, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	m, ok := c.opts.Membership.View().Owner(id.Hi)
	if !ok {
		return nil, fmt.Errorf("dfkv: empty ring: %w", ErrUnavailable)
	}
	p := c.peerFor(m)
	if p.cooling() {
		c.m.fastFails.Inc()
		return nil, fmt.Errorf("dfkv: %s (%s) cooling down: %w", m.ID, m.Addr, ErrUnavailable)
	}
	return p, nil
}

// statusError is a server reply status: the connection stays usable.
type statusError struct{ err error }

func (e statusError) Error() string { return e.err.Error() }
func (e statusError) Unwrap() error { return e.err }

// exec runs op on a pooled connection to p, retrying once on a fresh connection when a
// reused one turns out to have been closed while idle. Every dfkv op is idempotent, so the
// replay is safe. Transport failures start the peer's cool-down; the caller's context
// ending does not (the peer did nothing wrong).
func (c *Client) exec(ctx context.Context, p *peer, op func(pc *pconn) error) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return ctxErr(p.addr, err)
		}
		pc, err := p.get(ctx)
		if err != nil {
			var se statusError
			if errors.As(err, &se) {
				return se.err // refused at HELLO (Forbidden): the node is healthy
			}
			if ctx.Err() == nil {
				p.markFailed()
			}
			return err
		}
		ctxBound := pc.begin(ctx, c.opts.IOTimeout)
		err = op(pc)
		if pc.end() {
			// The context ended during the request; end closed the connection.
			if err == nil {
				p.markHealthy()
				return nil
			}
			return ctxErr(p.addr, ctx.Err())
		}
		if err == nil {
			p.markHealthy()
			p.put(pc)
			return nil
		}
		var se statusError
		if errors.As(err, &se) {
			p.markHealthy()
			p.put(pc)
			return se.err
		}
		pc.nc.Close()
		if ctxBound && os.IsTimeout(err) {
			// The caller's deadline, shorter than the I/O deadline, passed first.
			return ctxErr(p.addr, context.DeadlineExceeded)
		}
		if attempt == 0 && pc.reused && isStale(err) {
			c.m.retries.Inc()
			continue
		}
		if !errors.Is(err, ErrProtocol) {
			p.markFailed()
		}
		return ioErr(p.addr, err)
	}
}

// Put stores value under key.
func (c *Client) Put(ctx context.Context, key, value []byte) error {
	return c.PutSegs(ctx, key, [][]byte{value})
}

// PutSegs stores the concatenation of segs under key (gathered by writev, not copied).
func (c *Client) PutSegs(ctx context.Context, key []byte, segs [][]byte) error {
	start := time.Now()
	total := uint64(0)
	for _, s := range segs {
		total += uint64(len(s))
	}
	if total == 0 {
		return fmt.Errorf("dfkv: put: empty value: %w", ErrInvalid)
	}
	if total > c.opts.Limits.MaxValue {
		return fmt.Errorf("dfkv: put: %d bytes exceeds max value %d: %w: %w", total, c.opts.Limits.MaxValue, ErrTooLarge, ErrInvalid)
	}
	if err := c.noDeviceSource(segs); err != nil {
		return err
	}
	id := c.ID(key)
	p, err := c.route(id)
	if err == nil {
		op := &onesided.Op{Kind: fb.OpPut, Tenant: c.tenant, ID: id, Value: segs}
		if c.opts.RDMA == nil || total > c.rdmaBlock() {
			// TCP: no RDMA, or larger than the declared RDMA block
		} else if done, rerr := c.rdmaExec(ctx, p, op); done {
			err = tooLargeFor(p, total, rdmaStatus(rerr, op))
			c.m.done(opPut, err, int64(total), start)
			return err
		}
		err = c.exec(ctx, p, func(pc *pconn) error {
			req := wire.Request{Op: fb.OpPut, Tenant: c.tenant, ID: id, PayloadLen: total}
			if err := pc.send(&req, segs...); err != nil {
				return err
			}
			resp, err := pc.recv(fb.OpPut)
			if err != nil {
				return err
			}
			return statusReply(resp)
		})
		err = tooLargeFor(p, total, err)
	}
	c.m.done(opPut, err, int64(total), start)
	return err
}

// tooLargeFor names a server's refusal of a value over the max value size it advertised in
// HELLO (it answers Invalid) as ErrTooLarge, so callers can tell it from other refusals.
func tooLargeFor(p *peer, total uint64, err error) error {
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrTooLarge) {
		return err
	}
	if h := p.limits.Load(); h != nil && h.MaxValueBytes > 0 && total > h.MaxValueBytes {
		return fmt.Errorf("dfkv: put: %d bytes exceeds the node's max value %d: %w: %w", total, h.MaxValueBytes, ErrTooLarge, err)
	}
	return err
}

func statusReply(resp wire.Response) error {
	if resp.PayloadLen != 0 {
		return fmt.Errorf("%w: unexpected %d-byte payload", ErrProtocol, resp.PayloadLen)
	}
	if resp.Status != fb.StatusOk {
		return statusError{statusErr(resp.Status)}
	}
	return nil
}

// Get reads a value that must be exactly len(buf) bytes into buf.
func (c *Client) Get(ctx context.Context, key, buf []byte) error {
	_, err := c.get(ctx, key, [][]byte{buf}, wire.FlagExact, 0, uint64(len(buf)), opGet)
	return err
}

// GetAuto reads a value of at most len(buf) bytes into buf and returns its length. A longer
// stored value is ErrBufferTooSmall (a miss).
func (c *Client) GetAuto(ctx context.Context, key, buf []byte) (int, error) {
	n, err := c.get(ctx, key, [][]byte{buf}, wire.FlagCap, 0, uint64(len(buf)), opGet)
	return int(n), err
}

// GetRange reads len(buf) bytes starting at off.
func (c *Client) GetRange(ctx context.Context, key []byte, off uint64, buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("dfkv: get range: empty buffer: %w", ErrInvalid)
	}
	_, err := c.get(ctx, key, [][]byte{buf}, 0, off, uint64(len(buf)), opGet)
	return err
}

// GetAutoSegs scatters a value of at most sum(len(segs)) bytes across segs in order.
func (c *Client) GetAutoSegs(ctx context.Context, key []byte, segs [][]byte) (int, error) {
	total := uint64(0)
	for _, s := range segs {
		total += uint64(len(s))
	}
	n, err := c.get(ctx, key, segs, wire.FlagCap, 0, total, opGet)
	return int(n), err
}

func (c *Client) get(ctx context.Context, key []byte, segs [][]byte, flags uint8, off, length uint64, op opKind) (uint64, error) {
	start := time.Now()
	if length == 0 {
		return 0, fmt.Errorf("dfkv: get: empty buffer: %w", ErrInvalid)
	}
	id := c.ID(key)
	direct, err := c.rdma.Direct(segs)
	if err != nil {
		return 0, err
	}
	if direct {
		return c.directGet(ctx, id, segs, flags, off, length, op, start)
	}
	var n uint64
	p, err := c.route(id)
	if err == nil {
		if done, rn, rerr := c.rdmaGet(ctx, p, id, segs, flags, off, length); done {
			c.m.done(op, rerr, int64(rn), start)
			return rn, rerr
		}
		if rp := c.replicaPeer(id); rp != nil {
			var herr error
			if n, _, herr = c.getOnce(ctx, rp, id, segs, flags|wire.FlagReplica, off, length); herr == nil {
				c.m.hotReads.WithLabelValues("hit").Inc()
				c.m.done(op, nil, int64(n), start)
				return n, nil
			}
			c.m.hotReads.WithLabelValues("fallback").Inc() // a replica miss is never the answer
		}
		var hot wire.Hot
		n, hot, err = c.getOnce(ctx, p, id, segs, flags, off, length)
		if err == nil {
			c.hot.learn(id, hot)
		}
	}
	c.m.done(op, err, int64(n), start)
	return n, err
}

// getOnce is one GET of id from p over TCP; it returns the reply's hot-object hint.
func (c *Client) getOnce(ctx context.Context, p *peer, id identity.ObjectID, segs [][]byte, flags uint8, off, length uint64) (n uint64, hot wire.Hot, err error) {
	err = c.exec(ctx, p, func(pc *pconn) error {
		req := wire.Request{Op: fb.OpGet, Flags: flags, Tenant: c.tenant, ID: id, Offset: off, Length: length}
		if err := pc.send(&req); err != nil {
			return err
		}
		resp, err := pc.recv(fb.OpGet)
		if err != nil {
			return err
		}
		if resp.Status != fb.StatusOk {
			if resp.PayloadLen != 0 {
				return fmt.Errorf("%w: payload on a failed get", ErrProtocol)
			}
			if resp.Status == fb.StatusInvalid && resp.ValueLen != 0 && flags&(wire.FlagExact|wire.FlagCap) != 0 {
				// The value exists but does not fit the caller's size contract.
				return statusError{fmt.Errorf("dfkv: stored %d bytes, asked %d: %w", resp.ValueLen, length, ErrBufferTooSmall)}
			}
			return statusError{statusErr(resp.Status)}
		}
		if resp.PayloadLen > length {
			return fmt.Errorf("%w: %d-byte payload for a %d-byte buffer", ErrProtocol, resp.PayloadLen, length)
		}
		if short := flags&wire.FlagExact != 0 && resp.PayloadLen != length; short || (flags&(wire.FlagExact|wire.FlagCap) != 0 && resp.PayloadLen == 0) {
			// A hit must fill an exact read, and no stored value is empty: anything else
			// would report bytes the caller's buffer does not hold.
			return fmt.Errorf("%w: %d-byte payload for an exact %d-byte read", ErrProtocol, resp.PayloadLen, length)
		}
		if err := readSegs(pc, segs, resp.PayloadLen); err != nil {
			return err
		}
		n, hot = resp.PayloadLen, resp.Hot
		return nil
	})
	return n, hot, err
}

// readSegs reads n payload bytes straight into segs in order.
func readSegs(pc *pconn, segs [][]byte, n uint64) error {
	if pc.fd != nil {
		return pc.readSegsDirect(segs, n)
	}
	for _, s := range segs {
		if n == 0 {
			break
		}
		k := min(uint64(len(s)), n)
		if _, err := io.ReadFull(pc.br, s[:k]); err != nil {
			return err
		}
		n -= k
	}
	if n != 0 {
		return fmt.Errorf("%w: payload longer than buffers", ErrProtocol)
	}
	return nil
}

// readSegsDirect is readSegs for blocking I/O: what the buffered reader already holds is
// copied, the rest arrives by one vectored read into the segments.
func (pc *pconn) readSegsDirect(segs [][]byte, n uint64) error {
	pc.bufs = pc.bufs[:0]
	for _, s := range segs {
		if n == 0 {
			break
		}
		k := min(uint64(len(s)), n)
		s = s[:k]
		n -= k
		if b := pc.br.Buffered(); b > 0 {
			m, _ := pc.br.Read(s[:min(len(s), b)]) // never blocks: the bytes are buffered
			s = s[m:]
		}
		if len(s) > 0 {
			pc.bufs = append(pc.bufs, s)
		}
	}
	if n != 0 {
		clear(pc.bufs)
		return fmt.Errorf("%w: payload longer than buffers", ErrProtocol)
	}
	err := pc.fd.readv(pc.bufs)
	clear(pc.bufs)
	return err
}

// Exist returns the stored length of key's value, or ErrNotFound.
func (c *Client) Exist(ctx context.Context, key []byte) (int64, error) {
	start := time.Now()
	id := c.ID(key)
	var n int64
	p, err := c.route(id)
	if err == nil {
		op := &onesided.Op{Kind: fb.OpExist, Tenant: c.tenant, ID: id}
		if done, rerr := c.rdmaExec(ctx, p, op); done {
			err = rdmaStatus(rerr, op)
			c.m.done(opExist, err, 0, start)
			return int64(op.ValueLen), err
		}
		err = c.exec(ctx, p, func(pc *pconn) error {
			req := wire.Request{Op: fb.OpExist, Tenant: c.tenant, ID: id}
			if err := pc.send(&req); err != nil {
				return err
			}
			resp, err := pc.recv(fb.OpExist)
			if err != nil {
				return err
			}
			n = int64(resp.ValueLen)
			return statusReply(resp)
		})
	}
	c.m.done(opExist, err, 0, start)
	return n, err
}

// Remove deletes key's value; an absent key is ErrNotFound.
func (c *Client) Remove(ctx context.Context, key []byte) error {
	start := time.Now()
	id := c.ID(key)
	p, err := c.route(id)
	if err == nil {
		op := &onesided.Op{Kind: fb.OpRemove, Tenant: c.tenant, ID: id}
		if done, rerr := c.rdmaExec(ctx, p, op); done {
			err = rdmaStatus(rerr, op)
			c.m.done(opRemove, err, 0, start)
			return err
		}
		err = c.exec(ctx, p, func(pc *pconn) error {
			req := wire.Request{Op: fb.OpRemove, Tenant: c.tenant, ID: id}
			if err := pc.send(&req); err != nil {
				return err
			}
			resp, err := pc.recv(fb.OpRemove)
			if err != nil {
				return err
			}
			return statusReply(resp)
		})
	}
	c.m.done(opRemove, err, 0, start)
	return err
}

// NodeStats fetches the STATS control reply of one node by address.
func (c *Client) NodeStats(ctx context.Context, addr string) (map[string]float64, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	p := c.peerFor(Member{ID: addr, Addr: addr})
	var out map[string]float64
	err := c.exec(ctx, p, func(pc *pconn) error {
		req := wire.Request{Op: fb.OpStats}
		if err := pc.send(&req); err != nil {
			return err
		}
		resp, err := pc.recv(fb.OpStats)
		if err != nil {
			return err
		}
		if resp.Status != fb.StatusOk || resp.PayloadLen > 1<<20 {
			return fmt.Errorf("%w: stats status %d, %d bytes", ErrProtocol, resp.Status, resp.PayloadLen)
		}
		buf := make([]byte, resp.PayloadLen)
		if _, err := io.ReadFull(pc.br, buf); err != nil {
			return err
		}
		out, err = wire.DecodeStats(buf)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return nil
	})
	return out, err
}

// Ping round-trips a PING to the node at addr (used by benchmarks and health checks).
func (c *Client) Ping(ctx context.Context, addr string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	p := c.peerFor(Member{ID: addr, Addr: addr})
	return c.exec(ctx, p, func(pc *pconn) error {
		req := wire.Request{Op: fb.OpPing}
		if err := pc.send(&req); err != nil {
			return err
		}
		resp, err := pc.recv(fb.OpPing)
		if err != nil {
			return err
		}
		return statusReply(resp)
	})
}

// TLSFromFiles builds a client TLS configuration from PEM files: ca verifies the servers
// (empty: the system roots); cert and key, when given, are the client certificate for
// servers that require one (mTLS).
func TLSFromFiles(ca, cert, key string) (*tls.Config, error) {
	t, err := secure.LoadClient(secure.TLSFiles{CA: ca, Cert: cert, Key: key}, nil)
	if err != nil {
		return nil, fmt.Errorf("dfkv: %w", err)
	}
	return t.Config(), nil
}
