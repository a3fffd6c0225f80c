package mds

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/secure/securetest"
)

// TestEtcdStoreTLS: an etcd serving https with client-certificate auth (embedded here, the
// same listener an external etcd runs) is reachable with the CA and a client certificate
// (dfkv_mds --etcd-cacert/--etcd-cert/--etcd-key), and not in plaintext or without a
// client certificate.
func TestEtcdStoreTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts an embedded etcd")
	}
	dir := t.TempDir()
	ca, err := securetest.NewCA("etcd CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile, _ := ca.WriteCA(dir, "ca")
	srv, _ := ca.Issue("etcd", securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
	srvCert, srvKey, _ := srv.Write(dir, "etcd")
	cli, _ := ca.Issue("mds", securetest.LeafOptions{Client: true})
	cliCert, cliKey, _ := cli.Write(dir, "mds")
	emb, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir(), ClientAddr: freeAddr(t), PeerAddr: freeAddr(t),
		ClientTLS: &EmbeddedTLS{Cert: srvCert, Key: srvKey, CA: caFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	if !strings.HasPrefix(emb.Endpoint, "https://") {
		t.Fatalf("endpoint %s", emb.Endpoint)
	}
	hostPort := strings.TrimPrefix(emb.Endpoint, "https://")
	ping := func(files *secure.TLSFiles) error {
		var st *EtcdStore
		var err error
		if files == nil {
			st, err = NewEtcdStore([]string{hostPort}, time.Second)
		} else {
			tl, lerr := secure.LoadClient(*files, nil)
			if lerr != nil {
				t.Fatal(lerr)
			}
			st, err = NewEtcdStoreTLS([]string{hostPort}, time.Second, tl.Config())
		}
		if err != nil {
			return err
		}
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return st.Ping(ctx)
	}
	if err := ping(&secure.TLSFiles{CA: caFile, Cert: cliCert, Key: cliKey}); err != nil {
		t.Fatalf("TLS with a client certificate: %v", err)
	}
	if err := ping(nil); err == nil {
		t.Fatal("plaintext reached a TLS etcd")
	}
	if err := ping(&secure.TLSFiles{CA: caFile}); err == nil {
		t.Fatal("no client certificate reached an etcd that requires one")
	}
}
