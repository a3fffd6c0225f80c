package client

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Detached sockets serve the C ABI's GET fast path (go/cmd/libdfkv, fastget.c): a C caller
// thread runs a whole GET in C on a socket it owns, with no call into Go, because each entry
// into Go from a foreign thread costs more than the rest of the client together (see
// docs/BENCHMARKS.md, "C ABI, part 4"). Policy stays here: the socket is dialed, greeted
// (HELLO, token) and put in blocking mode by this package, failures seen on it start the
// peer's cool-down through it, and the GETs it serves are counted in this client's metrics.

// DetachedInfo is what a request sent on a detached socket must carry.
type DetachedInfo struct {
	Tenant    uint64        // the tenant hash of every request header
	Namespace []byte        // the key namespace of identity.Object
	IOTimeout time.Duration // the per-request deadline
	PoolSize  int           // idle sockets worth keeping per member (Options.PoolSize)
}

// Detachable reports whether this client can hand out detached sockets: blocking I/O on
// (Linux), and neither TLS (the bytes are not the socket's) nor RDMA (GETs may not go over
// TCP).
func (c *Client) Detachable() (DetachedInfo, bool) {
	if !c.detachable() {
		return DetachedInfo{}, false
	}
	o := &c.opts
	return DetachedInfo{Tenant: c.tenant, Namespace: append([]byte(nil), o.Namespace...), IOTimeout: o.IOTimeout, PoolSize: o.PoolSize}, true
}

func (c *Client) detachable() bool {
	o := &c.opts
	return blockingSupported && o.BlockingIO && o.TLS == nil && o.RDMA == nil
}

// errNotSocket: the transport is not a kernel socket (an in-memory or TLS dialer).
var errNotSocket = errors.New("dfkv: detached socket: the transport is not a kernel socket")

// DialDetached connects to the member at addr exactly as the pool does (HELLO with this
// client's token, the server's limits learned) and returns the blocking socket's
// descriptor, which the caller owns and must close. While the peer cools down it fails
// with ErrUnavailable without dialing; a failed dial starts the cool-down.
func (c *Client) DialDetached(addr string) (int, error) {
	if c.closed.Load() {
		return -1, ErrClosed
	}
	if !c.detachable() {
		return -1, errNotSocket
	}
	p := c.peerFor(Member{Addr: addr})
	if p.cooling() {
		c.m.fastFails.Inc()
		return -1, fmt.Errorf("dfkv: %s cooling down: %w", addr, ErrUnavailable)
	}
	pc, err := p.dial(context.Background(), true)
	if err != nil {
		var se statusError
		if !errors.As(err, &se) {
			p.markFailed()
		}
		return -1, err
	}
	if pc.fd == nil || pc.br.Buffered() != 0 {
		// Not a kernel socket, or bytes beyond HELLO's reply already read: refuse rather
		// than hand out a stream out of step.
		pc.nc.Close()
		return -1, errNotSocket
	}
	return pc.fd.detach(), nil
}

// DetachedGetFailed reports a GET that failed on a detached socket to addr after d with
// the transport error err: the peer's cool-down starts as it would for a pooled
// connection, and the GET is counted as failed. It returns the error a pooled request would
// have returned.
func (c *Client) DetachedGetFailed(addr string, err error, d time.Duration) error {
	c.peerFor(Member{Addr: addr}).markFailed()
	c.m.ops[opGet][resError].Inc()
	c.m.latency[opGet].Observe(d.Seconds())
	return ioErr(addr, err)
}

// RecordDetachedGets counts GETs served on detached sockets in this client's metrics: hits,
// misses, the value bytes moved, and each call's latency.
func (c *Client) RecordDetachedGets(hits, misses uint64, bytes uint64, latencies []time.Duration) {
	m := c.m
	if hits > 0 {
		m.ops[opGet][resOK].Add(float64(hits))
	}
	if misses > 0 {
		m.ops[opGet][resMiss].Add(float64(misses))
	}
	if bytes > 0 {
		m.bytes[opGet].Add(float64(bytes))
	}
	for _, d := range latencies {
		m.latency[opGet].Observe(d.Seconds())
	}
}
