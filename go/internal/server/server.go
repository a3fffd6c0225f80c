package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Config configures a Server. Zero durations take the defaults below.
type Config struct {
	Engine              store.Engine
	Limits              wire.Limits
	MaxConns            int           // open data connections (default 4096)
	FirstRequestTimeout time.Duration // a new connection must send a full prefix within this (default 30s)
	IdleTimeout         time.Duration // an idle pooled connection is closed after this (default 10m)
	IOTimeout           time.Duration // each payload read and reply write must finish within this (default 30s)
	MaxDepth            uint32        // pipelining window advertised in Hello (default 64)
	// PutWindow bounds the PUTs of one connection whose device write is in flight while
	// the connection reads on (default DefaultPutWindow).
	PutWindow       int
	SoftwareVersion string
	Logger          *slog.Logger
	Metrics         *Metrics   // nil = a private registry
	AccessLog       *AccessLog // nil = no access log
	// Auth, when set, makes every op but PING and HELLO need a token (sent in HELLO) that
	// grants it on the request's tenant; others are answered Forbidden.
	Auth *secure.Tokens
	// RDMA, when set, answers RdmaBootstrap: the connection then carries the RDMA
	// bootstrap and stays open as that RDMA connection's liveness signal (docs/RDMA.md).
	RDMA RDMAServer
	// Tagger, when set, takes the engine identities of Op Tag (KV events); without it Op
	// Tag answers Ok with count 0.
	Tagger Tagger
	// Hot, when set, spreads hot objects over the next ring owners and holds the replicas
	// other primaries push here (hot.go); nil = off (replica requests answer Invalid).
	Hot *Hot
}

// Tagger attaches engine identities to stored objects (tagged.Engine).
type Tagger interface {
	// SetTags attaches tags to objects of tenant stored here and returns how many.
	SetTags(tenant uint64, tags []wire.ObjectTag) int
}

func (c *Config) setDefaults() {
	if c.Limits == (wire.Limits{}) {
		c.Limits = wire.DefaultLimits()
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 4096
	}
	if c.FirstRequestTimeout <= 0 {
		c.FirstRequestTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.IOTimeout <= 0 {
		c.IOTimeout = 30 * time.Second
	}
	if c.MaxDepth == 0 {
		c.MaxDepth = 64
	}
	if c.PutWindow <= 0 {
		c.PutWindow = DefaultPutWindow
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(prometheus.NewRegistry(), nil)
	}
}

// Server serves the dfkv protocol over any number of listeners.
type Server struct {
	cfg      Config
	log      *slog.Logger
	m        *Metrics
	draining atomic.Bool
	nconns   atomic.Int64

	mu        sync.Mutex
	listeners map[transport.Listener]struct{}
	conns     map[*conn]struct{}
	wg        sync.WaitGroup
	drained   chan struct{} // closed by Shutdown: ends RDMA sessions
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("server: no storage engine")
	}
	cfg.setDefaults()
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return &Server{
		cfg: cfg, log: cfg.Logger, m: cfg.Metrics,
		listeners: map[transport.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		drained:   make(chan struct{}),
	}, nil
}

// SetHot turns hot-object spreading on (Config.Hot); call it before Serve. It exists
// because the spreading state needs the node's bound address, known after New.
func (s *Server) SetHot(h *Hot) { s.cfg.Hot = h }

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("server: closed")

// Serve accepts connections until the listener fails or Shutdown is called.
func (s *Server) Serve(l transport.Listener) error {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.draining.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				// Transient (e.g. EMFILE): back off instead of spinning.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; backing off", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("server: accept: %w", err)
		}
		backoff = 0
		if s.nconns.Add(1) > int64(s.cfg.MaxConns) {
			s.nconns.Add(-1)
			s.m.ConnsRejected.WithLabelValues("max_conns").Inc()
			nc.Close()
			continue
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.draining.Load() {
			s.mu.Unlock()
			s.nconns.Add(-1)
			nc.Close()
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.m.ConnsAccepted.Inc()
		s.m.Connections.Inc()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			s.nconns.Add(-1)
			s.m.Connections.Dec()
		}()
	}
}

// Shutdown stops accepting, lets every connection finish the request it is serving, closes
// idle connections, and waits until all are gone or ctx ends (then closes the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.draining.Swap(true) {
		close(s.drained)
	}
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.interruptIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// Conns returns the number of open data connections.
func (s *Server) Conns() int { return int(s.nconns.Load()) }
