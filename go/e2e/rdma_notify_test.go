package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// TestRDMANotifyDrain: a Go client with native notifications (RDMAOptions.Notify) against a
// real dfkv_server --rdma over the soft provider: PUT/GET byte-exact over RDMA; on SIGTERM
// the server's drain notice reaches the client natively (its dfkv_rdma_notify_recvs_total
// moves, no fallback), before the process is gone.
func TestRDMANotifyDrain(t *testing.T) {
	s := startServer(t, t.TempDir(), "--rdma", "--rdma-provider", "soft", "--cap", "256MiB", "--max-msg", "64MiB")
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("notify"), IOTimeout: 10 * time.Second,
		RDMA: &client.RDMAOptions{Provider: "soft", Notify: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 8 {
		key, v := []byte{byte(i)}, rnd(1000+i*70000, uint64(i))
		if err := c.Put(context.Background(), key, v); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(v))
		if err := c.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	if c.TransportMode() != "rdma" {
		t.Fatalf("mode %q", c.TransportMode())
	}
	if got := s.metric("dfkv_rdma_notify_endpoints"); got != 1 {
		t.Fatalf("server notification endpoints %v, want 1 (the pooled connection's)", got)
	}
	snap := func() string { return string(c.Snapshot()) }
	if !strings.Contains(snap(), "dfkv_rdma_notify_endpoints 1") {
		t.Fatalf("client has no notification endpoint:\n%s", snap())
	}
	s.stop()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(snap(), "dfkv_rdma_notify_recvs_total 1") {
		if time.Now().After(deadline) {
			t.Fatalf("no native drain notice:\n%s", snap())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(snap(), "dfkv_rdma_notify_fallbacks_total 0") {
		t.Fatalf("fallback used:\n%s", snap())
	}
}
