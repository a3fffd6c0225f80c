package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Probe answers a health question: nil means healthy, an error says why not.
type Probe func() error

// HTTPConfig configures the observability listener.
type HTTPConfig struct {
	Addr              string // host:port; port 0 picks a free one
	Gatherer          prometheus.Gatherer
	Ready             Probe         // /readyz; nil = always ready
	MaxConns          int           // connection cap (default 64)
	FirstRequestLimit time.Duration // a connection must send its request within this (default 30s)
	Logger            *slog.Logger
	Handlers          map[string]http.Handler // more pages on the same listener (e.g. the MDS's /status)
	TLS               *tls.Config             // serve HTTPS (the same certificates as the data port); nil = HTTP
}

// HTTPServer is a running observability endpoint.
type HTTPServer struct {
	srv  *http.Server
	ln   net.Listener
	tls  *tls.Config
	done chan struct{}
}

// StartHTTP listens and serves in the background.
func StartHTTP(cfg HTTPConfig) (*HTTPServer, error) {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 64
	}
	if cfg.FirstRequestLimit <= 0 {
		cfg.FirstRequestLimit = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen %s: %w", cfg.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	for path, hd := range cfg.Handlers {
		mux.Handle(path, hd)
	}
	h := &HTTPServer{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: cfg.FirstRequestLimit,
			ReadTimeout:       cfg.FirstRequestLimit,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    16 << 10,
		},
		ln:   &limitListener{Listener: ln, sem: make(chan struct{}, cfg.MaxConns)},
		tls:  cfg.TLS,
		done: make(chan struct{}),
	}
	go func() {
		defer close(h.done)
		ln := h.ln
		if h.tls != nil {
			// net/http runs the handshake under ReadTimeout, so a stalled one is dropped.
			ln = tls.NewListener(ln, h.tls)
		}
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("metrics listener stopped", "err", err)
		}
	}()
	return h, nil
}

// Addr returns the bound address.
func (h *HTTPServer) Addr() string { return h.ln.Addr().String() }

// Close stops the listener, waiting up to ctx for in-flight scrapes.
func (h *HTTPServer) Close(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	<-h.done
	return err
}

// limitListener refuses connections beyond a cap by closing them at once, so a flood cannot
// exhaust file descriptors or goroutines.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &releaseConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			c.Close()
		}
	}
}

type releaseConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
