package mds

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// DefaultMaxConns: a client following the ring holds two connections (its long poll and
// its registration heartbeats), and all of them may land on one replica when another is down.
const DefaultMaxConns = 8192

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("mds: server closed")

// ServerConfig configures the MDS listener.
type ServerConfig struct {
	Service             *Service
	MaxConns            int           // default DefaultMaxConns
	FirstRequestTimeout time.Duration // default 10s
	IdleTimeout         time.Duration // default 120s
	IOTimeout           time.Duration // per frame body and reply, default 10s
	Logger              *slog.Logger
	Metrics             *Metrics
	// Auth, when set, requires a token in every request: member registration and the
	// client list need admin, the other calls any known token.
	Auth *secure.Tokens
}

// Server serves MDS frames over TCP: one request at a time per connection, with a
// connection cap, a first-request deadline, an idle timeout and a payload cap.
type Server struct {
	cfg    ServerConfig
	limits wire.Limits
	sem    chan struct{}

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	// waitCtx is the context of long polls: it ends first thing in Shutdown.
	waitCtx    context.Context
	waitCancel context.CancelFunc

	// The last topology reply encoded: a change wakes every long poll of a group with the
	// same watched topology, so one encoding serves them all.
	encMu   sync.Mutex
	encFor  wire.MdsResponse
	encoded []byte
}

// encode encodes resp, reusing the previous encoding for the same topology reply.
func (s *Server) encode(resp *wire.MdsResponse) []byte {
	if resp.Topology == nil || resp.Clients != nil || resp.Error != "" {
		return wire.EncodeMdsResponse(resp)
	}
	s.encMu.Lock()
	defer s.encMu.Unlock()
	if s.encoded != nil && s.encFor.Topology == resp.Topology && s.encFor.Status == resp.Status &&
		s.encFor.LeaseTTLMS == resp.LeaseTTLMS && s.encFor.WaitMS == resp.WaitMS {
		return s.encoded
	}
	s.encFor, s.encoded = *resp, wire.EncodeMdsResponse(resp)
	return s.encoded
}

// NewServer validates cfg.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Service == nil {
		return nil, errors.New("mds: no service")
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.FirstRequestTimeout <= 0 {
		cfg.FirstRequestTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 120 * time.Second
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	waitCtx, waitCancel := context.WithCancel(ctx)
	return &Server{cfg: cfg, limits: wire.DefaultLimits(), sem: make(chan struct{}, cfg.MaxConns),
		conns: map[net.Conn]struct{}{}, ctx: ctx, cancel: cancel, waitCtx: waitCtx, waitCancel: waitCancel}, nil
}

// Serve accepts connections until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errors.ErrUnsupported) {
				continue
			}
			// EMFILE and friends: back off instead of spinning.
			backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("mds accept failed", "err", err)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		select {
		case s.sem <- struct{}{}:
		default:
			s.cfg.Metrics.connRejected("max_conns")
			nc.Close()
			continue
		}
		if !s.track(nc) {
			<-s.sem
			nc.Close()
			return ErrServerClosed
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			s.serveConn(nc)
		}()
	}
}

func (s *Server) track(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[nc] = struct{}{}
	return true
}

func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
}

func (s *Server) serveConn(nc net.Conn) {
	s.cfg.Metrics.conns(1)
	defer s.cfg.Metrics.conns(-1)
	defer s.untrack(nc)
	defer nc.Close()
	defer func() {
		if r := recover(); r != nil {
			s.cfg.Logger.Error("mds connection panic", "remote", nc.RemoteAddr().String(), "panic", r)
		}
	}()
	if err := secure.Handshake(nc, time.Now().Add(s.cfg.FirstRequestTimeout)); err != nil {
		s.cfg.Metrics.connRejected("tls_handshake")
		return
	}
	var hdr [wire.RequestSize]byte
	wait := s.cfg.FirstRequestTimeout
	for {
		_ = nc.SetReadDeadline(time.Now().Add(wait))
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			if wait == s.cfg.FirstRequestTimeout && isTimeout(err) {
				s.cfg.Metrics.connRejected("first_request_timeout")
			}
			return
		}
		wait = s.cfg.IdleTimeout
		req, err := wire.DecodeRequest(hdr[:])
		if err != nil {
			s.cfg.Metrics.frameInvalid("prefix")
			s.reply(nc, fb.StatusInvalid, nil)
			return
		}
		if err := s.limits.CheckMds(&req); err != nil {
			s.cfg.Metrics.frameInvalid("limits")
			var fe *wire.FrameError
			if errors.As(err, &fe) && fe.Resync {
				_ = nc.SetReadDeadline(time.Now().Add(s.cfg.IOTimeout))
				if _, err := io.CopyN(io.Discard, nc, int64(req.PayloadLen)); err == nil && s.reply(nc, fb.StatusInvalid, nil) {
					continue
				}
			} else {
				s.reply(nc, fb.StatusInvalid, nil)
			}
			return
		}
		body := make([]byte, req.PayloadLen)
		_ = nc.SetReadDeadline(time.Now().Add(s.cfg.IOTimeout))
		if _, err := io.ReadFull(nc, body); err != nil {
			return
		}
		mreq, err := wire.DecodeMdsRequest(body)
		var resp *wire.MdsResponse
		if err != nil {
			s.cfg.Metrics.frameInvalid("table")
			resp = &wire.MdsResponse{Status: fb.StatusInvalid, Error: err.Error()}
		} else if !s.permitted(&mreq) {
			resp = &wire.MdsResponse{Status: fb.StatusForbidden, Error: "forbidden: the request's token does not grant " + fb.EnumNamesMdsOp[mreq.Op]}
		} else if mreq.Op == fb.MdsOpListTopology && mreq.WaitMS > 0 {
			resp = s.cfg.Service.Handle(s.waitCtx, &mreq)
		} else {
			resp = s.cfg.Service.Handle(s.ctx, &mreq)
		}
		if !s.reply(nc, fb.StatusOk, s.encode(resp)) {
			return
		}
	}
}

// permitted checks the request's token when tokens are on.
func (s *Server) permitted(r *wire.MdsRequest) bool {
	if s.cfg.Auth == nil {
		return true
	}
	g := s.cfg.Auth.Lookup([]byte(r.Token))
	switch r.Op {
	case fb.MdsOpRegisterMember, fb.MdsOpHeartbeatMember, fb.MdsOpDeregisterMember, fb.MdsOpListClients:
		return g.Allows(0, secure.RightAdmin)
	default:
		return g != nil
	}
}

// reply writes a response frame (op Mds); a non-Ok status carries no payload.
func (s *Server) reply(nc net.Conn, st fb.Status, payload []byte) bool {
	buf := make([]byte, wire.ResponseSize+len(payload))
	(&wire.Response{Op: fb.OpMds, Status: st, PayloadLen: uint64(len(payload))}).Encode(buf)
	copy(buf[wire.ResponseSize:], payload)
	_ = nc.SetWriteDeadline(time.Now().Add(s.cfg.IOTimeout))
	_, err := nc.Write(buf)
	return err == nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Shutdown stops accepting, closes idle connections and waits (bounded by ctx) for
// in-flight requests; the rest are closed when ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.waitCancel() // long polls answer "unchanged" now; their clients move on
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		// Wake readers blocked between requests; a request being handled finishes first
		// because its reply write has its own deadline.
		_ = c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}
