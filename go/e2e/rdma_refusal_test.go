package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// A server that refuses RDMA — one without it, and one whose handshake fails (its
// --rdma-gid-index names an index the port does not have, so every bootstrap is refused
// with that reason) — costs the client one bootstrap per backoff period, not one per op:
// the ops in between go over TCP, TransportMode says why and for how long, and the next
// refusal doubles the period.
func TestRDMARefusalBackoff(t *testing.T) {
	const base = 3 * time.Second
	for _, tc := range []struct {
		name   string
		args   []string
		reason string
	}{
		{"server without RDMA", nil, "does not serve RDMA"},
		{"handshake refused", []string{"--rdma", "--rdma-provider", "soft", "--rdma-gid-index", "1"}, "gid index 1 set by the operator is not in the port's GID table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, t.TempDir(), tc.args...)
			ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.New(client.Options{Membership: ms, Namespace: []byte("refusal"),
				RDMA: &client.RDMAOptions{Provider: "soft", RefusalBackoff: base, RefusalBackoffMax: 2 * base}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ops := func(n int) {
				t.Helper()
				for i := range n {
					k := []byte(fmt.Sprint("k", i))
					if err := c.Put(context.Background(), k, []byte("v")); err != nil {
						t.Fatalf("put over TCP: %v", err)
					}
				}
			}
			start := time.Now()
			ops(11)
			if time.Since(start) >= base {
				t.Skipf("11 ops took %v on this loaded machine: longer than the backoff under test", time.Since(start))
			}
			if n := s.requests(fb.OpRdmaBootstrap); n != 1 {
				t.Fatalf("%v RDMA bootstraps for 11 ops, want 1 (then TCP for the backoff)", n)
			}
			mode := c.TransportMode()
			if !strings.HasPrefix(mode, "tcp(") || !strings.Contains(mode, tc.reason) || !strings.Contains(mode, "TCP for 3s, refusal 1") {
				t.Fatalf("transport mode %q", mode)
			}
			time.Sleep(base + 200*time.Millisecond)
			ops(5)
			if n := s.requests(fb.OpRdmaBootstrap); n != 2 {
				t.Fatalf("%v RDMA bootstraps after the backoff ran out, want 2", n)
			}
			if mode := c.TransportMode(); !strings.Contains(mode, "TCP for 6s, refusal 2") {
				t.Fatalf("second refusal does not double the backoff: %q", mode)
			}
			if len(tc.args) > 0 {
				if n := s.metric("dfkv_rdma_refused_total"); n != 2 {
					t.Fatalf("server refused %v bootstraps, want 2", n)
				}
			}
		})
	}
}

// A successful bootstrap resets the backoff: a server that refused, then came back with
// RDMA, then lost it again is held off for the base period again, not twice the last one.
func TestRDMARefusalBackoffResetsOnSuccess(t *testing.T) {
	const base = 2 * time.Second
	port := strconv.Itoa(freePort(t))
	s := startServer(t, t.TempDir(), "--port", port)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("reset"), Cooldown: 50 * time.Millisecond,
		IOTimeout: fabricTimeout(10 * time.Second),
		RDMA:      &client.RDMAOptions{Provider: "soft", RefusalBackoff: base, RefusalBackoffMax: 4 * base}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	put := func() error { return c.Put(context.Background(), []byte("k"), []byte("v")) }
	if err := put(); err != nil || s.requests(fb.OpRdmaBootstrap) != 1 {
		t.Fatalf("first put: %v, %v bootstraps", err, s.requests(fb.OpRdmaBootstrap))
	}
	restart := func(args ...string) {
		s.kill()
		s.args = append([]string{"--port", port}, args...)
		s.start()
	}
	restart("--rdma", "--rdma-provider", "soft")
	time.Sleep(base + 200*time.Millisecond)
	if err := put(); err != nil || c.TransportMode() != "rdma" {
		t.Fatalf("after the backoff, against a server with RDMA: %v, mode %s", err, c.TransportMode())
	}
	restart()
	// The pooled RDMA connection is dead: an op may fail on it; the next dial is refused.
	var refusedAt time.Time
	for i := 0; i < 20 && s.requests(fb.OpRdmaBootstrap) == 0; i++ {
		put()
		refusedAt = time.Now()
		time.Sleep(60 * time.Millisecond)
	}
	if n := s.requests(fb.OpRdmaBootstrap); n != 1 {
		t.Fatalf("%v bootstraps against the server without RDMA, want 1", n)
	}
	time.Sleep(time.Until(refusedAt.Add(base + 300*time.Millisecond)))
	if err := put(); err != nil {
		t.Fatal(err)
	}
	if n := s.requests(fb.OpRdmaBootstrap); n != 2 {
		t.Fatalf("%v bootstraps %v after the refusal that followed a success, want 2 (backoff back at its base)", n, base)
	}
}
