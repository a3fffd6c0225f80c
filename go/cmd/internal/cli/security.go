package cli

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
)

// Security holds a daemon's TLS and token flags (the same on dfkv_server and dfkv_mds).
type Security struct {
	TLS         secure.TLSFiles
	AuthTokens  string
	ReloadEvery time.Duration
}

// Define registers --tls-cert, --tls-key, --tls-ca, --tls-client-auth, --auth-tokens and
// --security-reload-interval.
func (s *Security) Define(fs *flag.FlagSet) {
	fs.StringVar(&s.TLS.Cert, "tls-cert", "", "PEM certificate (chain): serve TLS 1.3 on every port of this daemon, metrics included")
	fs.StringVar(&s.TLS.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&s.TLS.CA, "tls-ca", "", "PEM CA bundle client certificates must chain to (with --tls-client-auth)")
	fs.StringVar(&s.TLS.ClientAuth, "tls-client-auth", secure.ClientAuthNone, "client certificates: none, verify (checked when sent), require (mTLS)")
	fs.StringVar(&s.AuthTokens, "auth-tokens", "", "tenant token file (TOKEN RIGHTS TENANTS per line): every op needs a token granting it")
	fs.DurationVar(&s.ReloadEvery, "security-reload-interval", 2*time.Second, "how often the certificate and token files are checked for changes (SIGHUP reloads at once)")
}

// Validate checks the flags before anything starts.
func (s *Security) Validate() error {
	if s.ReloadEvery <= 0 {
		return fmt.Errorf("--security-reload-interval %v: must be positive", s.ReloadEvery)
	}
	return s.TLS.Validate(true)
}

// Loaded is a daemon's loaded security material, reloaded in the background after Start.
type Loaded struct {
	TLS    *secure.TLS    // nil: plaintext
	Tokens *secure.Tokens // nil: no tokens
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Load reads the files; a missing or malformed one is an error (the daemon does not start).
func (s *Security) Load(log *slog.Logger) (*Loaded, error) {
	l := &Loaded{}
	var err error
	if s.TLS.ServerEnabled() {
		if l.TLS, err = secure.LoadServer(s.TLS, log); err != nil {
			return nil, err
		}
	}
	if s.AuthTokens != "" {
		if l.Tokens, err = secure.LoadTokens(s.AuthTokens, log); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// ServerTLS returns the listener configuration, or nil when TLS is off.
func (l *Loaded) ServerTLS() *tls.Config {
	if l.TLS == nil {
		return nil
	}
	return l.TLS.Config()
}

// Start watches the files every interval and reloads them at once on SIGHUP.
func (l *Loaded) Start(interval time.Duration) {
	if l.TLS == nil && l.Tokens == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	kTLS, kTok := make(chan struct{}, 1), make(chan struct{}, 1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				for _, k := range []chan struct{}{kTLS, kTok} {
					select {
					case k <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	if l.TLS != nil {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.TLS.Watch(ctx, interval, kTLS) }()
	}
	if l.Tokens != nil {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.Tokens.Watch(ctx, interval, kTok) }()
	}
}

// Stop ends the watchers.
func (l *Loaded) Stop() {
	if l.cancel != nil {
		l.cancel()
		l.wg.Wait()
	}
}

// WarnIfOpen logs once when a daemon listens beyond loopback without TLS or tokens: anyone
// who can reach the port can then read the traffic or any tenant's keys.
func (l *Loaded) WarnIfOpen(log *slog.Logger, host string) {
	if l.TLS != nil && l.Tokens != nil {
		return
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
		return
	}
	log.Warn("listening beyond loopback without full protection: set --tls-cert/--tls-key and --auth-tokens",
		"host", host, "tls", l.TLS != nil, "auth_tokens", l.Tokens != nil)
}
