package mds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestEtcdStoreLeases runs the real EtcdStore against an embedded etcd: a registration is
// bound to a lease, another replica (a second client) can renew it, re-registration reuses
// it, a holder that stops heartbeating disappears after the TTL, Delete revokes.
func TestEtcdStoreLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts an embedded etcd")
	}
	emb, err := StartEmbedded(EmbeddedConfig{Dir: t.TempDir(), ClientAddr: freeAddr(t), PeerAddr: freeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Close()
	a, err := NewEtcdStore([]string{emb.Endpoint}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _ := NewEtcdStore([]string{emb.Endpoint}, 2*time.Second)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	for i := 0; i < 2; i++ {
		if err := a.Put(ctx, fmt.Sprintf("/t/m/%d", i), []byte("v"), ttl); err != nil {
			t.Fatal(err)
		}
	}
	lease0 := leaseOf(t, a, "/t/m/0")
	if err := b.Put(ctx, "/t/m/0", []byte("v2"), ttl); err != nil {
		t.Fatal(err)
	}
	if got := leaseOf(t, a, "/t/m/0"); got != lease0 {
		t.Fatalf("re-registration granted a new lease %x (had %x)", got, lease0)
	}
	// Replica b keeps /t/m/0 alive; /t/m/1 gets no heartbeat and expires.
	deadline := time.Now().Add(4 * ttl)
	for time.Now().Before(deadline) {
		if err := b.KeepAlive(ctx, "/t/m/0", []byte("v3")); err != nil {
			t.Fatal(err)
		}
		kvs, err := a.List(ctx, "/t/m/", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) == 1 {
			if kvs[0].Key != "/t/m/0" || string(kvs[0].Value) != "v3" {
				t.Fatalf("survivor %+v", kvs[0])
			}
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if kvs, _ := a.List(ctx, "/t/m/", 10); len(kvs) != 1 {
		t.Fatalf("the silent holder did not expire: %d keys", len(kvs))
	}
	if err := a.KeepAlive(ctx, "/t/m/1", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("keepalive of an expired key: %v", err)
	}
	if err := a.Delete(ctx, "/t/m/0"); err != nil {
		t.Fatal(err)
	}
	if kvs, _ := a.List(ctx, "/t/m/", 10); len(kvs) != 0 {
		t.Fatalf("delete left %d keys", len(kvs))
	}
	if err := a.Delete(ctx, "/t/m/0"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
}

func leaseOf(t *testing.T, s *EtcdStore, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.cli.Get(ctx, key)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get %s: %v", key, err)
	}
	return r.Kvs[0].Lease
}
