package secure

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport"
)

// ClientAuth values of TLSFiles.ClientAuth (the --tls-client-auth flag).
const (
	ClientAuthNone    = "none"    // no client certificate asked for (default)
	ClientAuthVerify  = "verify"  // a client certificate is optional, but verified when sent
	ClientAuthRequire = "require" // mTLS: a client certificate signed by --tls-ca is required
)

// TLSFiles names the PEM files of one side of a TLS connection.
type TLSFiles struct {
	CA         string // server: CA for client certificates; client: CA for the server (empty = system roots)
	Cert, Key  string // server: required for TLS; client: the client certificate for mTLS (optional)
	ClientAuth string // server only: none, verify, require
}

// ServerEnabled reports whether the files ask for a TLS listener.
func (f TLSFiles) ServerEnabled() bool { return f.Cert != "" || f.Key != "" }

// ClientEnabled reports whether a client should dial TLS.
func (f TLSFiles) ClientEnabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Validate checks the combination before anything is loaded.
func (f TLSFiles) Validate(server bool) error {
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("tls: --tls-cert and --tls-key go together")
	}
	switch f.ClientAuth {
	case "", ClientAuthNone, ClientAuthVerify:
	case ClientAuthRequire:
		if server && f.CA == "" {
			return errors.New("tls: --tls-client-auth require needs --tls-ca (the CA client certificates chain to)")
		}
	default:
		return fmt.Errorf("tls: --tls-client-auth %q: want none, verify or require", f.ClientAuth)
	}
	if server && !f.ServerEnabled() && (f.CA != "" || (f.ClientAuth != "" && f.ClientAuth != ClientAuthNone)) {
		return errors.New("tls: --tls-ca / --tls-client-auth need --tls-cert and --tls-key")
	}
	return nil
}

// material is one loaded generation of a side's certificates.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
	sum  [sha256.Size]byte // of the file contents, to skip no-op reloads
	cf   *tls.Config       // the config built from this generation
}

// TLS is a reloadable TLS configuration: each handshake uses the certificates loaded last.
// A reload that fails (missing file, bad PEM, mismatched key) keeps the previous ones.
type TLS struct {
	files  TLSFiles
	server bool
	log    *slog.Logger
	cur    atomic.Pointer[material]
	mu     sync.Mutex // serializes reloads
	base   *tls.Config
}

// LoadServer loads server-side TLS material (certificate, key, optional client CA).
func LoadServer(f TLSFiles, log *slog.Logger) (*TLS, error) {
	if err := f.Validate(true); err != nil {
		return nil, err
	}
	return load(f, true, log)
}

// LoadClient loads client-side TLS material (server CA, optional client certificate).
func LoadClient(f TLSFiles, log *slog.Logger) (*TLS, error) {
	if err := f.Validate(false); err != nil {
		return nil, err
	}
	return load(f, false, log)
}

func load(f TLSFiles, server bool, log *slog.Logger) (*TLS, error) {
	if log == nil {
		log = slog.Default()
	}
	t := &TLS{files: f, server: server, log: log}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	if server {
		t.base = &tls.Config{MinVersion: tls.VersionTLS13, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load().cf, nil
		}}
	}
	return t, nil
}

// Config returns the *tls.Config to use now. A server's is fixed (its GetConfigForClient
// picks the certificates loaded last for every handshake); a client's is the current
// generation's, so each dial verifies against the CA loaded last.
func (t *TLS) Config() *tls.Config {
	if t.server {
		return t.base
	}
	return t.cur.Load().cf
}

// Reload rereads the files; it reports whether anything changed. On error the previous
// material stays in use.
func (t *TLS) Reload() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := sha256.New()
	read := func(name string) ([]byte, error) {
		if name == "" {
			return nil, nil
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		h.Write([]byte(name))
		h.Write(b)
		return b, nil
	}
	certPEM, err := read(t.files.Cert)
	if err != nil {
		return false, err
	}
	keyPEM, err := read(t.files.Key)
	if err != nil {
		return false, err
	}
	caPEM, err := read(t.files.CA)
	if err != nil {
		return false, err
	}
	var m material
	h.Sum(m.sum[:0])
	if old := t.cur.Load(); old != nil && old.sum == m.sum {
		return false, nil
	}
	if certPEM != nil {
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return false, fmt.Errorf("tls: %s / %s: %w", t.files.Cert, t.files.Key, err)
		}
		m.cert = &c
	}
	if caPEM != nil {
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(caPEM) {
			return false, fmt.Errorf("tls: %s: no PEM certificates", t.files.CA)
		}
	}
	// Full 16 KiB records from the first byte: cache replies are bulk transfers.
	m.cf = &tls.Config{MinVersion: tls.VersionTLS13, DynamicRecordSizingDisabled: true}
	if t.server {
		if m.cert == nil {
			return false, errors.New("tls: server needs a certificate")
		}
		m.cf.Certificates, m.cf.ClientCAs = []tls.Certificate{*m.cert}, m.pool
		switch t.files.ClientAuth {
		case ClientAuthRequire:
			m.cf.ClientAuth = tls.RequireAndVerifyClientCert
		case ClientAuthVerify:
			m.cf.ClientAuth = tls.VerifyClientCertIfGiven
		}
	} else {
		m.cf.RootCAs = m.pool // nil: the system roots
		if m.cert != nil {
			m.cf.Certificates = []tls.Certificate{*m.cert}
		}
	}
	t.cur.Store(&m)
	return true, nil
}

// Watch reloads on every tick of interval and whenever kick receives, until ctx ends.
// Reload failures are logged (once per distinct error) and the old material kept.
func (t *TLS) Watch(ctx context.Context, interval time.Duration, kick <-chan struct{}) {
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		case <-kick:
		}
		changed, err := t.Reload()
		switch {
		case err != nil && err.Error() != lastErr:
			t.log.Error("tls reload failed; keeping the previous certificates", "err", err)
			lastErr = err.Error()
		case changed:
			t.log.Info("tls certificates reloaded", "cert", t.files.Cert, "ca", t.files.CA)
			lastErr = ""
		}
	}
}

// Listener wraps l so that every accepted connection speaks TLS. The handshake is not run
// here (a slow or hostile peer must not stall Accept): it runs on the connection's first
// read, or explicitly through Handshake with the server's first-request deadline.
func Listener(l transport.Listener, cfg *tls.Config) transport.Listener {
	return &tlsListener{Listener: l, cfg: cfg}
}

type tlsListener struct {
	transport.Listener
	cfg *tls.Config
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.cfg), nil
}

// Handshake completes a server connection's TLS handshake (a no-op for plain connections)
// within deadline, so that a peer that sends nothing or garbage is dropped on time.
func Handshake(nc net.Conn, deadline time.Time) error {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return nil
	}
	_ = tc.SetDeadline(deadline)
	err := tc.Handshake()
	_ = tc.SetDeadline(time.Time{})
	return err
}

// Dialer wraps a transport dialer with a TLS client handshake. The server name checked is
// the host of the address dialed (the member's advertised host).
type Dialer struct {
	Inner  transport.Dialer
	Config func() *tls.Config // the client config to dial with now (e.g. (*TLS).Config)
}

// DialContext connects and completes the handshake within ctx.
func (d Dialer) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	nc, err := d.Inner.DialContext(ctx, addr)
	if err != nil {
		return nil, err
	}
	tc, err := ClientHandshake(ctx, nc, addr, d.Config())
	if err != nil {
		nc.Close()
		return nil, err
	}
	return tc, nil
}

// Mode names the inner transport (TLS is a layer over it, not another transport).
func (d Dialer) Mode() string { return d.Inner.Mode() }

// ClientHandshake runs a TLS client handshake over nc, naming the server by addr's host.
func ClientHandshake(ctx context.Context, nc net.Conn, addr string, cfg *tls.Config) (*tls.Conn, error) {
	c := cfg
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		c = cfg.Clone()
		c.ServerName = host
	}
	tc := tls.Client(nc, c)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
	}
	return tc, nil
}
