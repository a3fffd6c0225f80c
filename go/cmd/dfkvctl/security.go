package main

import (
	"crypto/tls"
	"flag"

	"github.com/dfkv/dfkv/go/client"
)

// secFlags are the connection-security flags shared by node and cluster commands (they may
// come before or after the command; DFKV_TOKEN, DFKV_TLS_CA, ... are read too).
type secFlags struct {
	token, ca, cert, key string
	cfg                  *tls.Config
}

var sec secFlags

func (s *secFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&s.token, "token", s.token, "tenant token for nodes and MDS run with --auth-tokens (DFKV_TOKEN)")
	fs.StringVar(&s.ca, "tls-ca", s.ca, "connect with TLS 1.3, verifying nodes and the MDS against this PEM CA")
	fs.StringVar(&s.cert, "tls-cert", s.cert, "client certificate for servers that require one (mTLS)")
	fs.StringVar(&s.key, "tls-key", s.key, "private key of --tls-cert")
}

// load builds the TLS configuration once the flags are final (nil: plaintext).
func (s *secFlags) load() error {
	if s.ca == "" && s.cert == "" && s.key == "" {
		return nil
	}
	cfg, err := client.TLSFromFiles(s.ca, s.cert, s.key)
	s.cfg = cfg
	return err
}
