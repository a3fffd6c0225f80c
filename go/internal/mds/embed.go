package mds

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedConfig configures an in-process etcd (the single-box default).
type EmbeddedConfig struct {
	Dir        string // data directory (created if missing)
	ClientAddr string // host:port for the etcd client listener (default 127.0.0.1:2379)
	PeerAddr   string // host:port for the etcd peer listener (default 127.0.0.1:2380)
	Name       string // member name (default "dfkv-mds")
	StartWait  time.Duration
	// ClientTLS serves the client listener over TLS (https) with these PEM files; with CA
	// set, etcd requires client certificates signed by it. Used to test --etcd-cacert & co.
	ClientTLS *EmbeddedTLS
}

// EmbeddedTLS names the PEM files of an embedded etcd's TLS client listener.
type EmbeddedTLS struct{ Cert, Key, CA string }

// Embedded is a running in-process etcd.
type Embedded struct {
	e        *embed.Etcd
	Endpoint string // client endpoint (http://host:port)
}

// StartEmbedded starts a single-member etcd and waits until it serves.
func StartEmbedded(c EmbeddedConfig) (*Embedded, error) {
	if c.ClientAddr == "" {
		c.ClientAddr = "127.0.0.1:2379"
	}
	if c.PeerAddr == "" {
		c.PeerAddr = "127.0.0.1:2380"
	}
	if c.Name == "" {
		c.Name = "dfkv-mds"
	}
	if c.StartWait <= 0 {
		c.StartWait = 60 * time.Second
	}
	scheme := "http://"
	if c.ClientTLS != nil {
		scheme = "https://"
	}
	cu, err := url.Parse(scheme + c.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("mds: embedded etcd client address %q: %w", c.ClientAddr, err)
	}
	pu, err := url.Parse("http://" + c.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("mds: embedded etcd peer address %q: %w", c.PeerAddr, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if t := c.ClientTLS; t != nil {
		cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = t.Cert, t.Key
		cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = t.CA, t.CA != ""
	}
	// Shutdown and transient errors are reported through Err() and our own logs; etcd's
	// zap output would only duplicate them.
	cfg.LogLevel = "fatal"
	cfg.LogOutputs = []string{"stderr"}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("mds: start embedded etcd in %s: %w", c.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("mds: embedded etcd: %w", err)
	case <-time.After(c.StartWait):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("mds: embedded etcd not ready within %v", c.StartWait)
	}
	return &Embedded{e: e, Endpoint: cu.String()}, nil
}

// Err reports a fatal error of the embedded server.
func (e *Embedded) Err() <-chan error { return e.e.Err() }

// Close stops the embedded etcd.
func (e *Embedded) Close() { e.e.Close() }
