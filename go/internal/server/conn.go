package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

const (
	readBufSize = 64 << 10
	// Replies smaller than this are coalesced in the out buffer and flushed when the peer
	// has no more pipelined requests buffered; larger payloads go out with writev.
	inlinePayload = 16 << 10
	outFlushAt    = 64 << 10
)

const (
	stateIdle int32 = iota
	stateBusy
	stateClosing
)

// errConn marks failures of the connection itself (peer gone, deadline, desync): the
// connection is closed without a reply.
type errConn struct{ err error }

func (e errConn) Error() string { return "connection: " + e.err.Error() }
func (e errConn) Unwrap() error { return e.err }

type conn struct {
	s     *Server
	nc    net.Conn
	br    *bufio.Reader
	state atomic.Int32
	hdr   [wire.RequestSize]byte
	out   []byte
	bufs  net.Buffers
	items []byte // batch items / sg preamble / control payloads
	first bool
	// The read and write deadlines in force, kept so that a busy connection re-arms them
	// only when they drift (see armRead): each SetDeadline is a runtime timer update, and
	// three of them per request were a measurable share of a small GET (docs/BENCHMARKS.md).
	// rdl is the reader goroutine's; wdl belongs to whoever writes, and writers are
	// serialized by the PUT pipeline's mutex.
	rdl, wdl time.Time

	acc       accessRecord // filled by the reply assembly for the access log
	accessN   uint64
	peer      string
	tenantFor uint64
	tenantStr string
	keyHex    [32]byte
	tsSec     int64
	tsPrefix  []byte
	sess      *secure.Session // nil: auth off

	pipe pipeline // PUTs whose device write is in flight (pipeline.go)

	gq    getQuery           // the GET in progress (see serveGet)
	onGet func([]byte) error // c.serveGet, bound once
}

func newConn(s *Server, nc net.Conn) *conn {
	nc = newRawConn(nc)
	c := &conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, readBufSize), out: make([]byte, 0, outFlushAt+wire.ResponseSize+inlinePayload), first: true}
	if s.cfg.Auth != nil {
		c.sess = s.cfg.Auth.NewSession()
	}
	c.pipe.init(s.cfg.PutWindow)
	c.onGet = c.serveGet
	return c
}

// interruptIfIdle wakes a connection blocked waiting for its next request so that it can
// observe a drain. A busy connection finishes its request first and then sees the flag.
func (c *conn) interruptIfIdle() {
	if c.state.CompareAndSwap(stateIdle, stateClosing) {
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

func (c *conn) serve() {
	defer c.nc.Close()
	defer c.logPending()
	defer c.pipe.waitIdle() // in-flight PUTs finish and reply before the socket closes
	log := c.s.log
	// A TLS connection completes its handshake within the first-request deadline; a peer
	// speaking plaintext or garbage is dropped here without touching other connections.
	if err := secure.Handshake(c.nc, time.Now().Add(c.s.cfg.FirstRequestTimeout)); err != nil {
		c.s.m.ConnsRejected.WithLabelValues("tls_handshake").Inc()
		log.Debug("tls handshake failed", "remote", c.nc.RemoteAddr(), "err", err)
		return
	}
	for {
		if c.s.draining.Load() {
			c.pipe.waitIdle()
			_ = c.flush()
			return
		}
		wait := c.s.cfg.IdleTimeout
		if c.first {
			wait = c.s.cfg.FirstRequestTimeout
		}
		// With PUTs in flight the reply buffer belongs to them (they flush it themselves).
		var flushErr error
		c.pipe.ifIdle(func() {
			if len(c.out) > 0 && (c.br.Buffered() == 0 || len(c.out) >= outFlushAt) {
				flushErr = c.flush()
			}
			c.logPending() // after the flush: the record costs the peer no latency
		})
		if flushErr != nil {
			return
		}
		c.armRead(time.Now(), wait)
		c.state.Store(stateIdle)
		// Shutdown sets draining before it interrupts idle connections: either it sees this
		// connection idle and wakes it, or this check sees the flag. Without it, a connection
		// that turned idle just after the sweep would block until its idle timeout.
		if c.s.draining.Load() {
			return
		}
		if _, err := io.ReadFull(c.br, c.hdr[:]); err != nil {
			var ne net.Error
			if c.first && errors.As(err, &ne) && ne.Timeout() && !c.s.draining.Load() {
				c.s.m.ConnsRejected.WithLabelValues("first_request_deadline").Inc()
			}
			return
		}
		if !c.state.CompareAndSwap(stateIdle, stateBusy) {
			return // drained while the prefix arrived
		}
		c.first = false
		start := time.Now()
		req, err := wire.DecodeRequest(c.hdr[:])
		if err != nil || req.PayloadLen > 0 {
			// A request without a payload reads nothing more before the next prefix, whose
			// wait arms the idle deadline anyway.
			c.armRead(start, c.s.cfg.IOTimeout)
		}
		if err == nil && req.Op == fb.OpPut && req.Flags&wire.FlagReplica == 0 && c.s.cfg.Limits.Check(&req) == nil && (c.sess == nil || c.permitted(&req)) {
			// A plain PUT: its device write overlaps the requests behind it.
			if err := c.startPut(&req, start); err != nil {
				log.Debug("closing connection", "remote", c.nc.RemoteAddr(), "op", opName(req.Op), "err", err)
				return
			}
			continue
		}
		// Every other request runs alone, after the PUTs before it have replied.
		c.pipe.waitIdle()
		if err != nil {
			reason := "bad_magic"
			if errors.Is(err, wire.ErrVersion) {
				reason = "version"
				c.replyStatus(req.Op, fb.StatusInvalid, 0)
				_ = c.flush()
			}
			c.s.m.FramesInvalid.WithLabelValues(reason).Inc()
			log.Debug("closing connection on bad prefix", "remote", c.nc.RemoteAddr(), "err", err)
			return
		}
		if err := c.s.cfg.Limits.Check(&req); err != nil {
			var fe *wire.FrameError
			errors.As(err, &fe)
			c.s.m.FramesInvalid.WithLabelValues(reasonOf(err)).Inc()
			c.s.m.request(req.Op, fb.StatusInvalid)
			if fe == nil || !fe.Resync {
				c.replyStatus(req.Op, fb.StatusInvalid, 0)
				_ = c.flush()
				return
			}
			if err := c.discard(req.PayloadLen); err != nil {
				return
			}
			c.replyStatus(req.Op, fb.StatusInvalid, 0)
			continue
		}
		c.acc = accessRecord{}
		if c.sess != nil && !c.permitted(&req) {
			// Skip the payload so the stream stays in sync; the connection stays usable.
			c.s.m.request(req.Op, fb.StatusForbidden)
			if err := c.discard(req.PayloadLen); err != nil {
				return
			}
			c.replyStatus(req.Op, fb.StatusForbidden, 0)
			if c.s.cfg.AccessLog != nil {
				c.noteAccess(&req, time.Since(start), nil) // refused requests are audited too
			}
			continue
		}
		if err := c.dispatch(&req); err != nil {
			log.Debug("closing connection", "remote", c.nc.RemoteAddr(), "op", opName(req.Op), "err", err)
			_ = c.flush()
			if c.s.cfg.AccessLog != nil {
				c.noteAccess(&req, time.Since(start), err)
			}
			return
		}
		d := time.Since(start)
		c.s.m.observe(req.Op, d.Seconds())
		if c.s.cfg.AccessLog != nil {
			c.noteAccess(&req, d, nil)
		}
	}
}

func reasonOf(err error) string {
	switch {
	case errors.Is(err, wire.ErrUnknownOp):
		return "unknown_op"
	case errors.Is(err, wire.ErrLimit):
		return "limit"
	default:
		return "malformed"
	}
}

// permitted reports whether the connection's token grants r. PING and HELLO need none
// (HELLO is how the token arrives); ops not listed need admin (fail closed).
func (c *conn) permitted(r *wire.Request) bool {
	var need secure.Right
	switch r.Op {
	case fb.OpPing, fb.OpHello:
		return true
	case fb.OpGet, fb.OpExist, fb.OpSgGet, fb.OpBatchGet, fb.OpBatchExist, fb.OpBatchExistLease:
		need = secure.RightRead
	case fb.OpPut, fb.OpSgPut, fb.OpBatchPut, fb.OpTag:
		need = secure.RightWrite
	case fb.OpRemove, fb.OpBatchRemove:
		need = secure.RightRemove
	default:
		need = secure.RightAdmin
	}
	if r.Flags&wire.FlagReplica != 0 && (r.Op == fb.OpPut || r.Op == fb.OpRemove) {
		need = secure.RightAdmin // node to node: a tenant must not plant or drop replicas
	}
	return c.sess.Grant().Allows(r.Tenant, need)
}

// dispatch executes one request. A returned error closes the connection.
func (c *conn) dispatch(r *wire.Request) error {
	key := store.Key{ID: r.ID, Tenant: r.Tenant}
	switch r.Op {
	case fb.OpPing:
		c.replyStatus(r.Op, fb.StatusOk, 0)
	case fb.OpHello:
		return c.hello(r)
	case fb.OpStats:
		return c.stats(r)
	case fb.OpPut:
		if r.Flags&wire.FlagReplica != 0 {
			return c.replicaPut(r, key)
		}
		st, err := c.put(key, int(r.PayloadLen))
		if err != nil {
			return err
		}
		c.s.m.request(r.Op, st)
		c.replyStatus(r.Op, st, 0)
	case fb.OpGet:
		return c.get(r.Op, key, r.Flags, r.Offset, r.Length)
	case fb.OpExist:
		n, err := c.s.cfg.Engine.Stat(key)
		st := statusOf(err)
		c.s.m.request(r.Op, st)
		c.replyStatus(r.Op, st, uint64(max(n, 0)))
	case fb.OpRemove:
		if r.Flags&wire.FlagReplica != 0 {
			st := fb.StatusInvalid
			if c.s.cfg.Hot != nil {
				c.s.cfg.Hot.invalidateReplica(key, r.Offset)
				st = fb.StatusOk
			}
			c.s.m.request(r.Op, st)
			c.replyStatus(r.Op, st, 0)
			return nil
		}
		st := statusOf(c.s.cfg.Engine.Remove(key))
		c.s.cfg.Hot.wrote(key)
		c.s.m.request(r.Op, st)
		c.replyStatus(r.Op, st, 0)
	case fb.OpSgPut, fb.OpSgGet:
		return c.sg(r, key)
	case fb.OpBatchPut:
		return c.batchPut(r)
	case fb.OpBatchGet, fb.OpBatchExist, fb.OpBatchRemove, fb.OpBatchExistLease:
		return c.batchRead(r)
	case fb.OpRdmaBootstrap:
		return c.rdmaBootstrap()
	case fb.OpTag:
		return c.tag(r)
	default:
		// Limits.Check refuses unknown ops; reaching here is a bug, not input.
		return errConn{fmt.Errorf("unhandled op %d", r.Op)}
	}
	return nil
}

// statusOf maps engine errors onto wire statuses.
func statusOf(err error) fb.Status {
	switch {
	case err == nil:
		return fb.StatusOk
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrCorrupt):
		return fb.StatusNotFound
	case errors.Is(err, store.ErrBusy):
		return fb.StatusBusy
	case errors.Is(err, store.ErrCacheFull):
		return fb.StatusCacheFull
	case errors.Is(err, ErrQuotaExceeded):
		return fb.StatusQuotaExceeded
	case errors.Is(err, store.ErrTooLarge), errors.Is(err, store.ErrInvalid):
		return fb.StatusInvalid
	default:
		return fb.StatusIOError
	}
}

// ErrQuotaExceeded is returned by quota-enforcing engine wrappers when a tenant is over
// its byte quota (the same sentinel as store.ErrQuotaExceeded).
var ErrQuotaExceeded = store.ErrQuotaExceeded

// put stores a size-byte value read straight from the socket into the engine's buffer.
func (c *conn) put(key store.Key, size int) (fb.Status, error) {
	filled := false
	var netErr error
	err := c.s.cfg.Engine.Put(key, size, func(dst []byte) error {
		filled = true
		if _, err := io.ReadFull(c.br, dst); err != nil {
			netErr = errConn{err}
			return netErr
		}
		return nil
	})
	if netErr != nil {
		return 0, netErr
	}
	if !filled {
		// Refused before reading: the value is still on the wire.
		if derr := c.discard(uint64(size)); derr != nil {
			return 0, derr
		}
	}
	c.s.cfg.Hot.wrote(key)
	if err == nil {
		c.s.m.BytesIn.Add(float64(size))
	} else if st := statusOf(err); st == fb.StatusIOError {
		c.s.log.Warn("put failed", "id", key.ID, "size", size, "err", err)
	}
	return statusOf(err), nil
}

// span resolves a GET's flags and range against a stored value's size.
func span(flags uint8, off, length, size uint64) (start, n uint64, ok bool) {
	switch {
	case flags&wire.FlagExact != 0:
		return 0, size, size == length
	case flags&wire.FlagCap != 0:
		return 0, size, size <= length
	}
	if off > size {
		return 0, 0, false
	}
	n = length
	if n == 0 {
		n = size - off
	}
	if n > size-off {
		return 0, 0, false
	}
	return off, n, true
}

func (c *conn) get(op fb.Op, key store.Key, flags uint8, off, length uint64) error {
	c.gq = getQuery{op: op, flags: flags, off: off, length: length, key: key}
	var err error
	if flags&wire.FlagReplica != 0 {
		err = store.ErrInvalid
		if c.s.cfg.Hot != nil {
			err = c.s.cfg.Hot.getReplica(key, c.onGet)
		}
	} else {
		err = c.s.cfg.Engine.Get(key, c.onGet)
	}
	werr := c.gq.werr
	c.gq = getQuery{}
	if werr != nil {
		return werr
	}
	if err != nil {
		st := statusOf(err)
		c.s.m.request(op, st)
		c.replyStatus(op, st, 0)
	}
	return nil
}

// getQuery is the GET being served, for serveGet: the engine calls back with the value,
// and a method value bound once (c.onGet) instead of a closure per request saves an
// allocation on the hottest path.
type getQuery struct {
	op          fb.Op
	flags       uint8
	off, length uint64
	key         store.Key
	werr        error // the reply's write failed: the connection is finished
}

func (c *conn) serveGet(v []byte) error {
	q := &c.gq
	size := uint64(len(v))
	start, n, ok := span(q.flags, q.off, q.length, size)
	if !ok {
		c.s.m.request(q.op, fb.StatusInvalid)
		c.replyStatus(q.op, fb.StatusInvalid, size)
		return nil
	}
	c.s.m.request(q.op, fb.StatusOk)
	resp := wire.Response{Op: q.op, Status: fb.StatusOk, ValueLen: size, PayloadLen: n}
	if q.op == fb.OpGet && q.flags&wire.FlagReplica == 0 {
		resp.Hot = c.s.cfg.Hot.noteRead(q.key)
	}
	q.werr = c.replyPayload(&resp, v[start:start+n])
	return q.werr
}

func (c *conn) sg(r *wire.Request, key store.Key) error {
	pre := uint64(r.Count) * wire.SgSegSize
	if err := c.readItems(pre); err != nil {
		return err
	}
	_, total, err := wire.DecodeSgSegs(c.items, int(r.Count), c.s.cfg.Limits.MaxValue)
	if r.Op == fb.OpSgGet {
		if err != nil {
			c.s.m.request(r.Op, fb.StatusInvalid)
			c.replyStatus(r.Op, fb.StatusInvalid, 0)
			return nil
		}
		return c.get(r.Op, key, wire.FlagExact, 0, total)
	}
	if err != nil || total != r.PayloadLen-pre {
		if derr := c.discard(r.PayloadLen - pre); derr != nil {
			return derr
		}
		c.s.m.FramesInvalid.WithLabelValues("sg_geometry").Inc()
		c.s.m.request(r.Op, fb.StatusInvalid)
		c.replyStatus(r.Op, fb.StatusInvalid, 0)
		return nil
	}
	st, perr := c.put(key, int(total))
	if perr != nil {
		return perr
	}
	c.s.m.request(r.Op, st)
	c.replyStatus(r.Op, st, 0)
	return nil
}

func (c *conn) batchPut(r *wire.Request) error {
	results := make([]wire.BatchResult, r.Count)
	remaining := r.PayloadLen
	var ib [wire.BatchItemSize]byte
	for i := range results {
		if remaining < wire.BatchItemSize {
			return c.desync(r.Op, "batch put items overrun payload")
		}
		if _, err := io.ReadFull(c.br, ib[:]); err != nil {
			return errConn{err}
		}
		remaining -= wire.BatchItemSize
		it, derr := wire.DecodeBatchItem(ib[:])
		if it.Length > remaining {
			return c.desync(r.Op, "batch put value overruns payload")
		}
		remaining -= it.Length
		if derr != nil || it.Length == 0 || it.Length > c.s.cfg.Limits.MaxValue || it.Flags&wire.FlagReplica != 0 {
			if err := c.discard(it.Length); err != nil {
				return err
			}
			results[i].Status = fb.StatusInvalid
			c.s.m.request(r.Op, fb.StatusInvalid)
			continue
		}
		st, err := c.put(store.Key{ID: it.ID, Tenant: r.Tenant}, int(it.Length))
		if err != nil {
			return err
		}
		results[i].Status = st
		c.s.m.request(r.Op, st)
	}
	if remaining != 0 {
		return c.desync(r.Op, "batch put payload longer than its items")
	}
	c.reserve(wire.ResponseSize + len(results)*wire.BatchResultSize)
	c.appendResponse(&wire.Response{Op: r.Op, Status: fb.StatusOk, Count: r.Count})
	for i := range results {
		c.appendResult(&results[i])
	}
	return nil
}

// tag attaches engine identities to stored objects (KV events). The reply's count is the
// number attached; a node without a Tagger attaches none. A payload that does not decode
// answers Invalid and the connection stays usable (its length was checked).
func (c *conn) tag(r *wire.Request) error {
	var buf []byte
	if r.PayloadLen <= uint64(c.s.cfg.Limits.MaxControl) {
		if err := c.readItems(r.PayloadLen); err != nil {
			return err
		}
		buf = c.items
	} else {
		// Large tag frames are rare (thousands of tokens per object): not kept.
		buf = make([]byte, r.PayloadLen)
		if _, err := io.ReadFull(c.br, buf); err != nil {
			return errConn{err}
		}
	}
	tags, err := wire.DecodeTagBatch(buf)
	if err != nil {
		c.s.m.FramesInvalid.WithLabelValues("tag").Inc()
		c.s.m.request(r.Op, fb.StatusInvalid)
		c.replyStatus(r.Op, fb.StatusInvalid, 0)
		return nil
	}
	n := 0
	if c.s.cfg.Tagger != nil {
		n = c.s.cfg.Tagger.SetTags(r.Tenant, tags)
	}
	c.s.m.request(r.Op, fb.StatusOk)
	c.appendResponse(&wire.Response{Op: r.Op, Status: fb.StatusOk, Count: uint32(n)})
	return nil
}

// desync answers Invalid and closes: the frame's own lengths contradict each other, so the
// stream position is unknown.
func (c *conn) desync(op fb.Op, why string) error {
	c.s.m.FramesInvalid.WithLabelValues("desync").Inc()
	c.replyStatus(op, fb.StatusInvalid, 0)
	return errConn{errors.New(why)}
}

func (c *conn) batchRead(r *wire.Request) error {
	if err := c.readItems(r.PayloadLen); err != nil {
		return err
	}
	e := c.s.cfg.Engine
	ttl := leaseTTL(r.Length)
	c.appendResponse(&wire.Response{Op: r.Op, Status: fb.StatusOk, Count: r.Count})
	for i := 0; i < int(r.Count); i++ {
		it, derr := wire.DecodeBatchItem(c.items[i*wire.BatchItemSize:])
		key := store.Key{ID: it.ID, Tenant: r.Tenant}
		if derr != nil {
			c.s.m.request(r.Op, fb.StatusInvalid)
			c.appendResult(&wire.BatchResult{Status: fb.StatusInvalid})
			continue
		}
		switch r.Op {
		case fb.OpBatchExist:
			n, err := e.Stat(key)
			st := statusOf(err)
			c.s.m.request(r.Op, st)
			c.appendResult(&wire.BatchResult{Status: st, ValueLen: uint64(max(n, 0))})
		case fb.OpBatchExistLease:
			n, leased, err := store.Lease(e, key, ttl)
			st := statusOf(err)
			c.s.m.request(r.Op, st)
			res := wire.BatchResult{Status: st, ValueLen: uint64(max(n, 0))}
			if leased && st == fb.StatusOk {
				res.Flags = wire.ResultLeased
			}
			c.appendResult(&res)
		case fb.OpBatchRemove:
			st := statusOf(e.Remove(key))
			c.s.cfg.Hot.wrote(key)
			c.s.m.request(r.Op, st)
			c.appendResult(&wire.BatchResult{Status: st})
		case fb.OpBatchGet:
			var werr error
			replica := it.Flags&wire.FlagReplica != 0
			get := e.Get
			if replica {
				get = func(store.Key, func([]byte) error) error { return store.ErrInvalid }
				if c.s.cfg.Hot != nil {
					get = c.s.cfg.Hot.getReplica
				}
			}
			err := get(key, func(v []byte) error {
				size := uint64(len(v))
				start, n, ok := span(it.Flags, it.Offset, it.Length, size)
				if !ok {
					c.s.m.request(r.Op, fb.StatusInvalid)
					c.appendResult(&wire.BatchResult{Status: fb.StatusInvalid, ValueLen: size})
					return nil
				}
				c.s.m.request(r.Op, fb.StatusOk)
				res := wire.BatchResult{Status: fb.StatusOk, ValueLen: size, PayloadLen: n}
				if !replica {
					res.Hot = c.s.cfg.Hot.noteRead(key)
				}
				werr = c.resultPayload(&res, v[start:start+n])
				return werr
			})
			if werr != nil {
				return werr
			}
			if err != nil {
				st := statusOf(err)
				c.s.m.request(r.Op, st)
				c.appendResult(&wire.BatchResult{Status: st})
			}
		}
		if len(c.out) >= outFlushAt {
			if err := c.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// leaseTTL turns a BatchExistLease's requested milliseconds into a lease duration.
func leaseTTL(ms uint64) time.Duration {
	if ms == 0 {
		ms = wire.DefaultLeaseMS
	}
	return time.Duration(min(ms, wire.MaxLeaseMS)) * time.Millisecond
}

func (c *conn) hello(r *wire.Request) error {
	if err := c.readItems(r.PayloadLen); err != nil {
		return err
	}
	l := c.s.cfg.Limits
	local := wire.Hello{
		ProtocolVersion: uint32(wire.ProtocolVersion), MinProtocolVersion: uint32(wire.ProtocolVersion),
		MaxValueBytes: l.MaxValue, MaxBatchItems: l.MaxBatchItems, MaxDepth: c.s.cfg.MaxDepth,
		SoftwareVersion: c.s.cfg.SoftwareVersion, Transport: "tcp",
	}
	if r.PayloadLen > 0 {
		peer, err := wire.DecodeHello(c.items)
		if err == nil {
			_, err = wire.Negotiate(local, peer)
		}
		if err != nil {
			c.s.m.FramesInvalid.WithLabelValues("hello").Inc()
			c.s.m.request(r.Op, fb.StatusInvalid)
			c.replyStatus(r.Op, fb.StatusInvalid, 0)
			return errConn{err}
		}
		if c.sess != nil {
			c.sess.SetToken(peer.Token)
		}
	}
	if c.sess != nil && c.sess.Grant() == nil {
		// No token or an unknown one: say so at connect time rather than on every op.
		c.s.m.request(r.Op, fb.StatusForbidden)
		c.replyStatus(r.Op, fb.StatusForbidden, 0)
		return errConn{errors.New("hello without a valid token")}
	}
	c.s.m.request(r.Op, fb.StatusOk)
	body := wire.EncodeHello(local)
	return c.replyPayload(&wire.Response{Op: r.Op, Status: fb.StatusOk, PayloadLen: uint64(len(body))}, body)
}

func (c *conn) stats(r *wire.Request) error {
	if err := c.discard(r.PayloadLen); err != nil {
		return err
	}
	st := c.s.cfg.Engine.Stats()
	m := map[string]float64{
		"store_objects": float64(st.Objects), "store_used_bytes": float64(st.UsedBytes),
		"store_capacity_bytes": float64(st.CapacityBytes), "store_evictions": float64(st.Evictions),
		"store_evicted_bytes": float64(st.EvictedBytes), "store_corrupt_reads": float64(st.CorruptReads),
		"store_read_bytes": float64(st.ReadBytes), "store_write_bytes": float64(st.WriteBytes),
		"store_io_errors": float64(st.IOErrors), "server_connections": float64(c.s.Conns()),
	}
	if l, ok := store.Find[store.Leaser](c.s.cfg.Engine); ok {
		ls := l.LeaseStats()
		m["lease_active_bytes"], m["lease_limit_bytes"] = float64(ls.ActiveBytes), float64(ls.LimitBytes)
		m["lease_granted"], m["lease_refused"] = float64(ls.Granted), float64(ls.Refused)
	}
	if st.Healthy {
		m["store_healthy"] = 1
	} else {
		m["store_healthy"] = 0
	}
	c.s.m.request(r.Op, fb.StatusOk)
	body := wire.EncodeStats(m)
	return c.replyPayload(&wire.Response{Op: r.Op, Status: fb.StatusOk, PayloadLen: uint64(len(body))}, body)
}

// readItems reads n bytes of frame preamble into c.items (n is bounded by Limits.Check).
func (c *conn) readItems(n uint64) error {
	if uint64(cap(c.items)) < n {
		c.items = make([]byte, n)
	}
	c.items = c.items[:n]
	if _, err := io.ReadFull(c.br, c.items); err != nil {
		return errConn{err}
	}
	return nil
}

func (c *conn) discard(n uint64) error {
	for n > 0 {
		step := min(n, 1<<30)
		d, err := c.br.Discard(int(step))
		n -= uint64(d)
		if err != nil {
			return errConn{err}
		}
	}
	return nil
}

// ---- reply assembly ----

func (c *conn) reserve(n int) {
	if cap(c.out)-len(c.out) < n {
		grown := make([]byte, len(c.out), len(c.out)+n+outFlushAt)
		copy(grown, c.out)
		c.out = grown
	}
}

func (c *conn) appendResponse(r *wire.Response) {
	c.reserve(wire.ResponseSize)
	n := len(c.out)
	c.out = c.out[:n+wire.ResponseSize]
	r.Encode(c.out[n:])
	c.acc.response(r)
}

func (c *conn) appendResult(r *wire.BatchResult) {
	c.reserve(wire.BatchResultSize)
	n := len(c.out)
	c.out = c.out[:n+wire.BatchResultSize]
	r.Encode(c.out[n:])
	c.acc.result(r)
}

func (c *conn) replyStatus(op fb.Op, st fb.Status, valueLen uint64) {
	c.appendResponse(&wire.Response{Op: op, Status: st, ValueLen: valueLen})
}

func (c *conn) replyPayload(r *wire.Response, payload []byte) error {
	c.appendResponse(r)
	return c.sendPayload(payload)
}

func (c *conn) resultPayload(r *wire.BatchResult, payload []byte) error {
	c.appendResult(r)
	return c.sendPayload(payload)
}

// sendPayload appends small payloads to the out buffer and sends large ones together with
// the pending prefixes in one writev, without copying the payload.
func (c *conn) sendPayload(p []byte) error {
	c.s.m.BytesOut.Add(float64(len(p)))
	if len(p) < inlinePayload {
		c.reserve(len(p))
		c.out = append(c.out, p...)
		if len(c.out) >= outFlushAt {
			return c.flush()
		}
		return nil
	}
	c.armWrite()
	c.bufs = append(c.bufs[:0], c.out, p)
	var err error
	if w, ok := c.nc.(buffersWriter); ok {
		_, err = w.writeBuffers(c.bufs)
	} else {
		bufs := c.bufs
		_, err = bufs.WriteTo(c.nc)
	}
	c.bufs[0], c.bufs[1] = nil, nil // do not keep the engine's buffer reachable
	c.out = c.out[:0]
	if err != nil {
		return errConn{err}
	}
	return nil
}

// armRead bounds the next reads by now+wait. The deadline in force is kept when it lies
// within the last eighth of that window: a connection busy with small requests re-arms
// once per wait/8 instead of per request, and a read still never outlives its wait nor
// ends more than an eighth of it early. A deadline later than wait is always replaced.
func (c *conn) armRead(now time.Time, wait time.Duration) {
	want := now.Add(wait)
	if c.rdl.After(want) || want.Sub(c.rdl) > wait/8 {
		_ = c.nc.SetReadDeadline(want)
		c.rdl = want
	}
}

// armWrite does the same for writes, which always wait IOTimeout.
func (c *conn) armWrite() {
	wait := c.s.cfg.IOTimeout
	want := time.Now().Add(wait)
	if c.wdl.After(want) || want.Sub(c.wdl) > wait/8 {
		_ = c.nc.SetWriteDeadline(want)
		c.wdl = want
	}
}

func (c *conn) flush() error {
	if len(c.out) == 0 {
		return nil
	}
	c.armWrite()
	_, err := c.nc.Write(c.out)
	c.out = c.out[:0]
	if err != nil {
		return errConn{err}
	}
	return nil
}

// buffersWriter is a connection that gathers segments into one system call itself
// (rawConn); net.Buffers.WriteTo only does that for the net package's own types.
type buffersWriter interface {
	writeBuffers(segs [][]byte) (int64, error)
}

// replicaPut stores a replica pushed by its primary (FlagReplica PUT: Offset is the
// generation, Length the lease in milliseconds). A refused push is answered without
// storing, its payload skipped.
func (c *conn) replicaPut(r *wire.Request, key store.Key) error {
	h := c.s.cfg.Hot
	size := int(r.PayloadLen)
	if h == nil || r.Length == 0 {
		if err := c.discard(r.PayloadLen); err != nil {
			return err
		}
		c.s.m.request(r.Op, fb.StatusInvalid)
		c.replyStatus(r.Op, fb.StatusInvalid, 0)
		return nil
	}
	filled := false
	var netErr error
	err := h.putReplica(key, r.Offset, time.Duration(r.Length)*time.Millisecond, size, func(dst []byte) error {
		filled = true
		if _, err := io.ReadFull(c.br, dst); err != nil {
			netErr = errConn{err}
			return netErr
		}
		return nil
	})
	if netErr != nil {
		return netErr
	}
	if !filled {
		if derr := c.discard(r.PayloadLen); derr != nil {
			return derr
		}
	}
	st := statusOf(err)
	if errors.Is(err, errReplicaStale) {
		st = fb.StatusInvalid
	}
	var reads uint64
	if err == nil {
		reads = h.takeReplicaReads(key)
	}
	c.s.m.request(r.Op, st)
	c.replyStatus(r.Op, st, reads) // value_len: the replica's reads since its previous push
	return nil
}
