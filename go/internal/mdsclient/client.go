package mdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Sentinel errors of a call.
var (
	// ErrNotRegistered: the MDS does not know the holder (its lease expired): register again.
	ErrNotRegistered = errors.New("mds: not registered")
	// ErrRejected: the MDS refused the request as invalid; retrying will not help.
	ErrRejected = errors.New("mds: request rejected")
	// ErrBackend: the MDS answered but its etcd is unavailable.
	ErrBackend = errors.New("mds: etcd unavailable")
	// ErrUnavailable: no MDS replica could be reached.
	ErrUnavailable = errors.New("mds: no replica reachable")
	// ErrForbidden: the MDS runs with tokens and Options.Token does not grant the call.
	ErrForbidden = errors.New("mds: forbidden")
	// ErrNoEndpoints: the endpoint list is empty.
	ErrNoEndpoints = errors.New("mds: no endpoints")
)

// Options configure a Client.
type Options struct {
	CallTimeout time.Duration // per attempt on one replica: dial + request + reply (default 2s)
	MaxResponse uint64        // largest reply payload accepted (default wire.MaxMdsResponse)
	TLS         *tls.Config   // dial replicas with TLS 1.3, checking the endpoint's host (nil = plaintext)
	Token       string        // tenant token sent with every call (MDS run with --auth-tokens)
	// Dial, when set, opens the TCP connections (the cluster harness counts bytes with it);
	// nil = a net.Dialer with CallTimeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client calls MDS replicas. It keeps one connection to the replica that answered last and
// moves to the next replica when that one fails. Safe for concurrent use; calls are
// serialized (MDS traffic is a few requests per second per process).
type Client struct {
	eps  []string
	opts Options

	mu   sync.Mutex
	cur  int
	conn net.Conn
}

// ParseEndpoints splits "h1:p1,h2:p2" and checks each address.
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(e); err != nil {
			return nil, fmt.Errorf("mds: endpoint %q: %w", e, err)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, ErrNoEndpoints
	}
	return out, nil
}

// New returns a client over endpoints (host:port each).
func New(endpoints []string, opts Options) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	for _, e := range endpoints {
		if _, _, err := net.SplitHostPort(e); err != nil {
			return nil, fmt.Errorf("mds: endpoint %q: %w", e, err)
		}
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 2 * time.Second
	}
	if opts.MaxResponse == 0 {
		opts.MaxResponse = wire.MaxMdsResponse
	}
	return &Client{eps: append([]string(nil), endpoints...), opts: opts}, nil
}

// Endpoints returns the configured replicas.
func (c *Client) Endpoints() []string { return append([]string(nil), c.eps...) }

// Close drops the cached connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	return nil
}

// Call sends req to the current replica, failing over through the others. A reply whose
// status is Ok returns (resp, nil); NotFound is ErrNotRegistered, Invalid is ErrRejected
// (neither is retried elsewhere: every replica would say the same); IOError (the replica's
// etcd is down) and transport failures move on to the next replica. The endpoint that
// produced the final answer is returned for logging.
func (c *Client) Call(ctx context.Context, req *wire.MdsRequest) (*wire.MdsResponse, string, error) {
	if c.opts.Token != "" {
		withToken := *req
		withToken.Token = c.opts.Token
		req = &withToken
	}
	payload := wire.EncodeMdsRequest(req)
	if uint64(len(payload)) > wire.DefaultLimits().MaxControl {
		return nil, "", fmt.Errorf("%w: request of %d bytes exceeds the control limit", ErrRejected, len(payload))
	}
	// A long poll may be held by the MDS for its wait: each attempt's deadline covers it.
	wait := time.Duration(req.WaitMS) * time.Millisecond
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i := 0; i < len(c.eps); i++ {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		ep := c.eps[c.cur]
		p, w := payload, wait
		if d, ok := ctx.Deadline(); ok && wait > 0 {
			// After a replica used up most of the caller's budget (it hung), the next one
			// is asked to hold only what is left, so that it answers "unchanged" in time
			// instead of being cut off mid-wait (a dropped connection and a plain-poll pause).
			if fit := time.Until(d) - c.opts.CallTimeout; fit < wait {
				short := *req
				short.WaitMS = uint32(max(fit, 0) / time.Millisecond)
				p, w = wire.EncodeMdsRequest(&short), time.Duration(short.WaitMS)*time.Millisecond
			}
		}
		resp, err := c.attempt(ctx, ep, p, w)
		if err == nil {
			switch resp.Status {
			case fb.StatusOk:
				return resp, ep, nil
			case fb.StatusNotFound:
				return resp, ep, fmt.Errorf("%s: %w: %s", ep, ErrNotRegistered, resp.Error)
			case fb.StatusInvalid:
				return resp, ep, fmt.Errorf("%s: %w: %s", ep, ErrRejected, resp.Error)
			case fb.StatusForbidden:
				return resp, ep, fmt.Errorf("%s: %w: %s", ep, ErrForbidden, resp.Error)
			default:
				err = fmt.Errorf("%w: %s", ErrBackend, resp.Error)
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
		c.dropConn()
		if ctx.Err() != nil {
			break // the caller gave up; the replica is not to blame
		}
		c.cur = (c.cur + 1) % len(c.eps)
	}
	allBackend := len(errs) > 0
	for _, e := range errs {
		allBackend = allBackend && errors.Is(e, ErrBackend)
	}
	if allBackend {
		return nil, "", errors.Join(errs...)
	}
	return nil, "", fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}

func (c *Client) dropConn() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// attempt runs one request on ep, reusing the cached connection once; a reused connection
// that fails with a stale-socket error is retried on a fresh one.
func (c *Client) attempt(ctx context.Context, ep string, payload []byte, wait time.Duration) (*wire.MdsResponse, error) {
	for try := 0; try < 2; try++ {
		reused := c.conn != nil
		if !reused {
			dial := c.opts.Dial
			if dial == nil {
				d := net.Dialer{Timeout: c.opts.CallTimeout}
				dial = d.DialContext
			}
			dctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
			nc, err := dial(dctx, "tcp", ep)
			if err == nil && c.opts.TLS != nil {
				var tc net.Conn
				if tc, err = secure.ClientHandshake(dctx, nc, ep, c.opts.TLS); err != nil {
					nc.Close()
				} else {
					nc = tc
				}
			}
			cancel()
			if err != nil {
				return nil, fmt.Errorf("dial: %w", err)
			}
			c.conn = nc
		}
		deadline := time.Now().Add(c.opts.CallTimeout + wait)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = c.conn.SetDeadline(deadline)
		// Cancelling ctx wakes the blocked read or write (a past deadline): the caller's
		// Close must not wait out CallTimeout on a replica that stopped answering.
		nc := c.conn
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
		resp, err := roundTrip(nc, payload, c.opts.MaxResponse)
		interrupted := !stop()
		if err == nil && !interrupted {
			return resp, nil
		}
		c.dropConn() // an interrupted connection may be mid-frame
		if err == nil {
			return resp, nil // answered as ctx ended: the answer stands
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("%w (%w)", cerr, err)
		}
		if !reused || !stale(err) {
			return nil, err
		}
	}
	return nil, errors.New("unreachable")
}

func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(err.Error(), "reset by peer") ||
		strings.Contains(err.Error(), "broken pipe")
}

// roundTrip writes one MDS frame and reads its reply.
func roundTrip(nc net.Conn, payload []byte, maxResp uint64) (*wire.MdsResponse, error) {
	buf := make([]byte, wire.RequestSize+len(payload))
	(&wire.Request{Op: fb.OpMds, PayloadLen: uint64(len(payload))}).Encode(buf)
	copy(buf[wire.RequestSize:], payload)
	if _, err := nc.Write(buf); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	var hdr [wire.ResponseSize]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	r, err := wire.DecodeResponse(hdr[:])
	if err != nil {
		return nil, fmt.Errorf("reply: %w", err)
	}
	if r.PayloadLen > maxResp {
		return nil, fmt.Errorf("reply: %w: %d bytes > %d", wire.ErrLimit, r.PayloadLen, maxResp)
	}
	body := make([]byte, r.PayloadLen)
	if _, err := io.ReadFull(nc, body); err != nil {
		return nil, fmt.Errorf("read reply body: %w", err)
	}
	if r.Op != fb.OpMds {
		// A frame-level refusal (e.g. a cache node's port given as an MDS endpoint).
		return nil, fmt.Errorf("reply: %w: op %d status %d (is this an MDS port?)", wire.ErrMalformed, r.Op, r.Status)
	}
	if r.Status != fb.StatusOk {
		return nil, fmt.Errorf("reply: frame refused with status %d", r.Status)
	}
	resp, err := wire.DecodeMdsResponse(body)
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// ParseInfo parses "k=v,k2=v2" (client_info) into pairs; empty entries are skipped.
func ParseInfo(s string) ([]wire.KV, error) {
	var out []wire.KV
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("mds: client_info entry %q: want k=v", f)
		}
		out = append(out, wire.KV{Key: k, Value: v})
	}
	if len(out) > wire.MaxMdsKVs {
		return nil, fmt.Errorf("client_info: %d entries > %d", len(out), wire.MaxMdsKVs)
	}
	return out, nil
}
