package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// TestRDMANotifyDrain: a Go client with native notifications (RDMAOptions.Notify) against a
// real dfkv_server --rdma over the soft provider: PUT/GET byte-exact over RDMA; on SIGTERM
// the server's drain notice reaches the client natively (its dfkv_rdma_notify_recvs_total
// moves, no fallback), before the process is gone.
func TestRDMANotifyDrain(t *testing.T) {
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "256MiB", "--max-msg", "64MiB")...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("notify"), IOTimeout: fabricTimeout(10 * time.Second),
		RDMA: &client.RDMAOptions{Provider: rdmaProvider, Notify: true}})
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

// TestRDMANotifyRailEvent: a real dfkv_server on soft0 and soft1; a Go client with native
// notifications connected on soft0. The server's soft1 port goes down and comes back: each
// published health change (down, quarantined, healthy) reaches the client as a native
// dfkv.rail notification on its soft0 connection; the server counts the sends on soft0.
func TestRDMANotifyRailEvent(t *testing.T) {
	softOnly(t)
	s, faults := startSoftRailsServer(t, "", "--max-msg", "4MiB")
	c := railEventClient(t, s, "rail", client.RDMAOptions{Provider: "soft", Device: "soft0", Notify: true})
	v := rnd(300000, 1)
	if err := c.Put(context.Background(), []byte("k"), v); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(v))
	if err := c.Get(context.Background(), []byte("k"), got); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get: %v", err)
	}
	if c.TransportMode() != "rdma" {
		t.Fatalf("mode %q", c.TransportMode())
	}
	recvs := func() float64 { return snapMetric(t, c.Snapshot(), "dfkv_rdma_notify_recvs_total") }
	if n := recvs(); n != 0 {
		t.Fatalf("%v notifications before any change", n)
	}
	if err := soft.WriteFaults(faults, "soft1 port down\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the rail-down event", func() bool { return recvs() >= 1 })
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	// Down -> Quarantined -> Healthy: three events in all.
	waitFor(t, 10*time.Second, "the recovery events", func() bool { return recvs() >= 3 })
	if n := snapMetric(t, c.Snapshot(), "dfkv_rdma_notify_fallbacks_total"); n != 0 {
		t.Fatalf("%v fallbacks", n)
	}
	if n := railMetric(t, s, "dfkv_rdma_rail_notify_sends_total", "soft0"); n != 3 {
		t.Fatalf("server sent %v notifications on soft0, want 3", n)
	}
	// The data path still works on soft0 afterwards.
	if err := c.Get(context.Background(), []byte("k"), got); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get after the events: %v", err)
	}
}

// TestRDMARailNoticeQuarantines: a client on soft0 and soft1 (soft0 primary, so every op
// uses soft0) hears the server's dfkv.rail notice that soft1 went down and quarantines
// soft1 towards that server at once: no op failed on soft1, no topology told it.
func TestRDMARailNoticeQuarantines(t *testing.T) {
	softOnly(t)
	s, faults := startSoftRailsServer(t, "", "--max-msg", "4MiB")
	c := railEventClient(t, s, "notice", client.RDMAOptions{Provider: "soft", Devices: []string{"soft0", "soft1"},
		Primary: "soft0", Notify: true, RailProbeInterval: -1})
	v := rnd(300000, 2)
	if err := c.Put(context.Background(), []byte("k"), v); err != nil {
		t.Fatal(err)
	}
	if c.TransportMode() != "rdma" {
		t.Fatalf("mode %q", c.TransportMode())
	}
	if q := clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", "soft1"); q != 0 {
		t.Fatalf("soft1 quarantined %v times before any event", q)
	}
	if err := soft.WriteFaults(faults, "soft1 port down\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "soft1 quarantined on the server's notice", func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", "soft1") == 1
	})
	if e := clientRail(t, c, "dfkv_rdma_client_rail_completion_errors_total", "soft1"); e != 0 {
		t.Fatalf("%v completion errors on soft1: the quarantine came from a failed op", e)
	}
	got := make([]byte, len(v))
	if err := c.Get(context.Background(), []byte("k"), got); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get on soft0 after the notice: %v", err)
	}
}

// startSoftRailsServer starts a dfkv_server on soft0 and soft1 whose rail health is
// sampled every 50 ms, with a soft fault file (returned, holding initial) that the test
// writes; extra flags follow the common ones.
func startSoftRailsServer(t *testing.T, initial string, extra ...string) (*serverProc, string) {
	t.Helper()
	dir := t.TempDir()
	faults := filepath.Join(dir, "soft-faults")
	if err := soft.WriteFaults(faults, initial); err != nil {
		t.Fatal(err)
	}
	t.Setenv(soft.FaultsEnv, faults)
	args := append([]string{"--cap", "256MiB", "--rdma", "--rdma-provider", "soft", "--rdma-dev", "soft0,soft1",
		"--rdma-segment", "64MiB", "--rdma-health-interval", "50ms", "--rdma-health-recovery-samples", "2"}, extra...)
	return startServer(t, filepath.Join(dir, "node"), args...), faults
}

// railEventClient is a Go client of s alone (closed at the test's end).
func railEventClient(t *testing.T, s *serverProc, ns string, o client.RDMAOptions) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte(ns), IOTimeout: fabricTimeout(10 * time.Second), RDMA: &o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
