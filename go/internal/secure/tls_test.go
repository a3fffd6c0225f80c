package secure

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure/securetest"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

func TestTLSFilesValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    TLSFiles
		ok   bool
	}{
		{"off", TLSFiles{}, true},
		{"server", TLSFiles{Cert: "c", Key: "k"}, true},
		{"cert without key", TLSFiles{Cert: "c"}, false},
		{"mtls", TLSFiles{Cert: "c", Key: "k", CA: "ca", ClientAuth: ClientAuthRequire}, true},
		{"mtls without ca", TLSFiles{Cert: "c", Key: "k", ClientAuth: ClientAuthRequire}, false},
		{"bad mode", TLSFiles{Cert: "c", Key: "k", ClientAuth: "sometimes"}, false},
		{"ca without cert", TLSFiles{CA: "ca"}, false},
	} {
		if err := tc.f.Validate(true); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestReloadKeepsConnections: a rotated certificate is served to new handshakes while a
// connection made before the rotation keeps working; a broken file keeps the old pair.
func TestReloadKeepsConnections(t *testing.T) {
	dir := t.TempDir()
	ca, err := securetest.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile, _ := ca.WriteCA(dir, "ca")
	cert, key := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	issue := func(cn string) {
		l, err := ca.Issue(cn, securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := securetest.WriteAtomic(key, l.KeyPEM); err != nil {
			t.Fatal(err)
		}
		if err := securetest.WriteAtomic(cert, l.CertPEM); err != nil {
			t.Fatal(err)
		}
	}
	issue("one")
	srv, err := LoadServer(TLSFiles{Cert: cert, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(inner, srv.Config())
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo
				defer c.Close()
				if Handshake(c, time.Now().Add(2*time.Second)) != nil {
					return
				}
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					_, _ = c.Write(buf[:n])
				}
			}()
		}
	}()
	cli, err := LoadClient(TLSFiles{CA: caFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := Dialer{Inner: tcp.Dialer{}, Config: cli.Config}
	dial := func() (net.Conn, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := d.DialContext(ctx, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c, c.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	old, cn := dial()
	defer old.Close()
	if cn != "one" {
		t.Fatalf("cn %s", cn)
	}
	issue("two")
	if changed, err := srv.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	c2, cn := dial()
	c2.Close()
	if cn != "two" {
		t.Fatalf("after reload: cn %s", cn)
	}
	if err := securetest.WriteAtomic(cert, []byte("not pem")); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Reload(); err == nil {
		t.Fatal("broken certificate accepted")
	}
	c3, cn := dial()
	c3.Close()
	if cn != "two" {
		t.Fatalf("after a failed reload: cn %s", cn)
	}
	_ = old.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := old.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := old.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("connection from before the rotation: %q %v", buf, err)
	}
}
