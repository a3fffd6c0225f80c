package cabi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/secure/securetest"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

// TestSecurityEnv: DFKV_TLS_* and DFKV_TOKEN reach the client built by dfkv_open_v2.
func TestSecurityEnv(t *testing.T) {
	dir := t.TempDir()
	ca, err := securetest.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	caFile, _ := ca.WriteCA(dir, "ca")
	leaf, _ := ca.Issue("srv", securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
	cert, key, _ := leaf.Write(dir, "srv")
	tokFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokFile, []byte("good all team\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := secure.LoadServer(secure.TLSFiles{Cert: cert, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := secure.LoadTokens(tokFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Engine: store.NewMem(1 << 20), Auth: toks})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(secure.Listener(inner, st.Config()))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	open := func(env map[string]string) uint64 {
		for _, k := range []string{"DFKV_TLS_CA", "DFKV_TLS_CERT", "DFKV_TLS_KEY", "DFKV_TOKEN", "DFKV_TENANT"} {
			t.Setenv(k, env[k])
		}
		o := good()
		o.Members = "n1=" + inner.Addr().String()
		return Open(&o)
	}
	id := open(map[string]string{"DFKV_TLS_CA": caFile, "DFKV_TOKEN": "good", "DFKV_TENANT": "team"})
	if id == 0 {
		t.Fatalf("open: %s", LastError())
	}
	defer Close(id)
	if rc, err := Lookup(id).Put([]byte("k"), []byte("v")); rc != 0 {
		t.Fatalf("put over TLS with a good token failed: %v", err)
	}
	buf := make([]byte, 1)
	if rc, err := Lookup(id).Get([]byte("k"), buf); rc != 1 || buf[0] != 'v' {
		t.Fatalf("get over TLS failed: %d %v", rc, err)
	}
	for name, env := range map[string]map[string]string{
		"wrong token":     {"DFKV_TLS_CA": caFile, "DFKV_TOKEN": "bad", "DFKV_TENANT": "team"},
		"other tenant":    {"DFKV_TLS_CA": caFile, "DFKV_TOKEN": "good", "DFKV_TENANT": "other"},
		"plaintext":       {"DFKV_TOKEN": "good", "DFKV_TENANT": "team"},
		"system roots CA": {"DFKV_TLS_CERT": cert, "DFKV_TLS_KEY": key, "DFKV_TOKEN": "good", "DFKV_TENANT": "team"},
	} {
		id := open(env)
		if id == 0 {
			t.Fatalf("%s: open: %s", name, LastError())
		}
		if rc, _ := Lookup(id).Put([]byte("k"), []byte("x")); rc != -1 {
			t.Errorf("%s: put succeeded", name)
		}
		Close(id)
	}
	if id := open(map[string]string{"DFKV_TLS_CA": filepath.Join(dir, "missing.pem")}); id != 0 || !strings.Contains(LastError(), "DFKV_TLS_CA") {
		t.Fatalf("missing CA file: id %d, error %q", id, LastError())
	}
}
