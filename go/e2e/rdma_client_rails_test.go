package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Client-side rail selection end to end (docs/RDMA.md §4, "Client rail selection"): a real
// dfkv_server serving two soft rails registers with a real dfkv_mds (embedded etcd); a Go
// client following the MDS topology opens one device per rail and picks rails per server
// from the published health. Each server and each client gets its own fault file, so a
// fault hits exactly one side.

type railRig struct {
	mds    *mdsProc
	s      *serverProc
	group  string
	faults string // the server's fault file
	dir    string
}

func startRailRig(t *testing.T, group string, serverArgs ...string) *railRig {
	t.Helper()
	dir := t.TempDir()
	mds := startMDS(t, "mds", []string{"--etcd", "embedded:" + filepath.Join(dir, "etcd"),
		"--etcd-client-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--etcd-peer-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))})
	faults := filepath.Join(dir, "server-faults")
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	t.Setenv(soft.FaultsEnv, faults) // the server inherits it
	args := append([]string{"--cap", "512MiB", "--max-msg", "8MiB", "--rdma", "--rdma-provider", "soft",
		"--rdma-dev", "soft0,soft1", "--rdma-segment", "128MiB", "--rdma-health-interval", "50ms",
		"--rdma-health-recovery-samples", "2", "--mds", mds.addr, "--group", group, "--id", "r1", "--advertise", "127.0.0.1:0"}, serverArgs...)
	s := startServer(t, filepath.Join(dir, "node"), args...)
	waitFor(t, 15*time.Second, "r1 registered", func() bool { return s.httpStatus("/readyz") == 200 })
	return &railRig{mds: mds, s: s, group: group, faults: faults, dir: dir}
}

func (r *railRig) client(t *testing.T, o client.RDMAOptions) *client.Client {
	t.Helper()
	ms, err := client.NewMDSMembership(client.MDSOptions{Endpoints: []string{r.mds.addr}, Group: r.group, Poll: 100 * time.Millisecond,
		// Short long polls: the tests count completed polls after a rail change, and the default
		// 10 s wait would leave all but the first one unanswered for 10 s each.
		LongPoll: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the client sees r1", func() bool { return len(ms.View().Members) == 1 })
	o.Provider = "soft"
	o.SoftFaultFile = filepath.Join(r.dir, "client-faults") // the clients' NICs: their own file
	if o.MaxBlock == 0 {
		o.MaxBlock = 4 << 20
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte(r.group), IOTimeout: fabricTimeout(30 * time.Second), RDMA: &o})
	if err != nil {
		ms.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); ms.Close() })
	return c
}

// clientRail reads one rail's series from a client's snapshot (0 when not exported yet).
func clientRail(t *testing.T, c *client.Client, name, rail string) float64 {
	t.Helper()
	prefix := name + `{rail="` + rail + `"} `
	for _, line := range strings.Split(string(c.Snapshot()), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

func putGetRound(t *testing.T, c *client.Client, prefix string, n, size int, seed uint64) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		k := []byte(prefix + strconv.Itoa(i))
		v := rnd(size, seed+uint64(i))
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatalf("put %s: %v (mode %s)", k, err, c.TransportMode())
		}
		got := make([]byte, size)
		if err := c.Get(ctx, k, got); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s: %v, equal %v", k, err, bytes.Equal(got, v))
		}
	}
}

// (a) Two healthy tier-0 rails: connections and requests spread over both.
func TestRDMAClientRailsSpread(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-a")
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1"}})
	putGetRound(t, c, "a", 12, 100000, 1)
	if c.TransportMode() != "rdma" {
		t.Fatalf("mode %s", c.TransportMode())
	}
	for _, rail := range []string{"soft0", "soft1"} {
		if ops, conns := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", rail), clientRail(t, c, "dfkv_rdma_client_rail_conns_opened_total", rail); ops < 6 || conns < 1 {
			t.Errorf("client rail %s: %v ops, %v conns (want the 24 ops spread round robin)", rail, ops, conns)
		}
		if n := railMetric(t, r.s, "dfkv_rdma_rail_conns_opened_total", rail); n < 1 {
			t.Errorf("server rail %s served %v connections", rail, n)
		}
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 0 {
		t.Errorf("%v PUT/GET requests over TCP", n)
	}
}

// (b) Tiers soft0;soft1: everything on soft0 while the topology says it is healthy; after
// the server's soft0 port goes down (published Down), the client moves to soft1.
func TestRDMAClientRailsTiers(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-b", "--rdma-tiers", "soft0;soft1")
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1"}, Tiers: [][]string{{"soft0"}, {"soft1"}},
		RailQuarantine: 300 * time.Millisecond})
	putGetRound(t, c, "b", 10, 50000, 10)
	if a, b := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0"), clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1"); a != 20 || b != 0 {
		t.Fatalf("tier 0 healthy: soft0 %v ops, soft1 %v (want 20, 0)", a, b)
	}
	if n := railMetric(t, r.s, "dfkv_rdma_rail_conns_opened_total", "soft1"); n != 0 {
		t.Fatalf("server soft1 served %v connections while tier 0 was healthy", n)
	}
	if err := soft.WriteFaults(r.faults, "soft0 port down\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "soft0 published down", func() bool {
		for _, m := range ctlRails(t, r.mds.addr, r.group).Members {
			for _, rl := range m.Rails {
				if rl.Device == "soft0" {
					return rl.State == "down"
				}
			}
		}
		return false
	})
	// The client needs a poll to learn it (or its own quarantine when a pooled soft0
	// connection breaks): either way the reads below succeed byte-exact on soft1.
	polls := mdsPolls(t, c.Snapshot())
	waitFor(t, 10*time.Second, "a client poll after the change", func() bool { return mdsPolls(t, c.Snapshot()) >= polls+2 })
	soft0 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0")
	putGetRound(t, c, "b2", 5, 50000, 30)
	if a, b := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0"), clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1"); a != soft0 || b != 10 {
		t.Fatalf("soft0 down: soft0 %v ops (was %v), soft1 %v (want 10)", a, soft0, b)
	}
	if c.TransportMode() != "rdma" {
		t.Fatalf("mode %s", c.TransportMode())
	}

	// The port comes back: once the topology says Healthy again, tier 0 is used again and
	// tier 1 no more.
	if err := soft.WriteFaults(r.faults, ""); err != nil {
		t.Fatal(err)
	}
	key, val := []byte("b-back"), rnd(4000, 99)
	if err := c.Put(context.Background(), key, val); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(val))
	waitFor(t, 15*time.Second, "the client back on soft0", func() bool {
		if err := c.Get(context.Background(), key, buf); err != nil || !bytes.Equal(buf, val) {
			t.Fatalf("get while soft0 recovers: %v", err)
		}
		return clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft0") > soft0
	})
	soft1 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1")
	putGetRound(t, c, "b3", 4, 50000, 50)
	if b := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1"); b != soft1 {
		t.Fatalf("soft0 healthy again, yet %v more ops on soft1", b-soft1)
	}
}

// (c) An injected completion error on the client's soft0 in the middle of a batch GET: the
// rail is quarantined, only the unfinished items are replayed on soft1, every item
// byte-exact. A PUT whose request may have been submitted when its rail broke is not
// replayed: it returns its error.
func TestRDMAClientRailsReplay(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-c")
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1"}, Primary: "soft0", Depth: 2})
	ctx := context.Background()
	const n, size = 48, 2 << 20
	items := make([]client.Item, n)
	for i := range items {
		items[i] = client.Item{Key: []byte("c" + strconv.Itoa(i)), Value: rnd(size, uint64(100+i))}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	if b := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1"); b != 0 {
		t.Fatalf("primary soft0 healthy, yet %v ops on soft1", b)
	}
	gets := make([]client.Item, n)
	for i := range gets {
		gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, size)}
	}
	served0 := r.s.metric("dfkv_rdma_v2_get_writes_total")
	done := make(chan error, 1)
	go func() { done <- c.BatchGet(ctx, gets, client.Exact) }()
	waitFor(t, 30*time.Second, "the batch under way", func() bool { return r.s.metric("dfkv_rdma_v2_get_writes_total") >= served0+4 })
	if err := soft.WriteFaults(filepath.Join(r.dir, "client-faults"), "soft0 comp_err 1\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("batch get: %v", err)
	}
	for i := range gets {
		if gets[i].Err != nil || !bytes.Equal(gets[i].Buf, items[i].Value) {
			t.Fatalf("item %d: %v, equal %v", i, gets[i].Err, bytes.Equal(gets[i].Buf, items[i].Value))
		}
	}
	replayed := clientRail(t, c, "dfkv_rdma_client_rail_replayed_ops_total", "soft1")
	if q := clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", "soft0"); q != 1 {
		t.Fatalf("soft0 quarantines %v, want 1", q)
	}
	if replayed < 1 || replayed > n-4 {
		t.Fatalf("%v items replayed on soft1; want the unfinished ones only (1..%d)", replayed, n-4)
	}
	if got := r.s.requests(fb.OpGet) + r.s.requests(fb.OpBatchGet); got != 0 {
		t.Fatalf("%v GETs over TCP", got)
	}

	// A PUT on a pooled soft0 connection whose request WR fails is not replayed. (The fault
	// is cleared first: c2's NICs would otherwise load it when they open.)
	if err := soft.WriteFaults(filepath.Join(r.dir, "client-faults"), ""); err != nil {
		t.Fatal(err)
	}
	c2 := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1"}, Primary: "soft0", Depth: 2})
	probe := make([]byte, size)
	if err := c2.Get(ctx, items[0].Key, probe); err != nil || !bytes.Equal(probe, items[0].Value) {
		t.Fatalf("c2 get: %v", err)
	}
	if got := clientRail(t, c2, "dfkv_rdma_client_rail_ops_total", "soft0"); got != 1 {
		t.Fatalf("c2's probe: %v ops on soft0, want 1", got)
	}
	if err := soft.WriteFaults(filepath.Join(r.dir, "client-faults"), "soft0 comp_err 1\n"); err != nil {
		t.Fatal(err)
	}
	puts0 := r.s.metric("dfkv_rdma_v2_put_writes_total")
	if err := c2.Put(ctx, []byte("c-put"), rnd(1000, 7)); err == nil {
		t.Fatal("a PUT whose rail broke under it succeeded: it was replayed")
	}
	if got := clientRail(t, c2, "dfkv_rdma_client_rail_replayed_ops_total", "soft1"); got != 0 {
		t.Fatalf("%v ops replayed for the PUT", got)
	}
	if got := clientRail(t, c2, "dfkv_rdma_client_rail_ops_total", "soft1"); got != 0 {
		t.Fatalf("the PUT went to soft1 (%v ops)", got)
	}
	if got := r.s.metric("dfkv_rdma_v2_put_writes_total"); got != puts0 {
		t.Fatalf("the server wrote %v PUTs after the fault", got-puts0)
	}
	if got := r.s.requests(fb.OpPut); got != 0 {
		t.Fatalf("the PUT was sent again over TCP (%v)", got)
	}
	// The peer itself is fine: the next op goes over soft1 at once.
	if err := c2.Put(ctx, []byte("c-put"), rnd(1000, 8)); err != nil {
		t.Fatalf("put after the rail broke: %v", err)
	}
	if got := clientRail(t, c2, "dfkv_rdma_client_rail_ops_total", "soft1"); got != 1 {
		t.Fatalf("soft1 ops %v after the retry, want 1", got)
	}
	for _, cl := range []*client.Client{c, c2} {
		if n := snapMetric(t, cl.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
			t.Fatalf("a rail failure cooled the server (%v) while another rail was healthy", n)
		}
	}
}

// (d) A client whose whitelist names a rail the server does not publish: ErrNoCompatibleRail
// is client-local; the op goes over TCP and the peer is not cooled.
func TestRDMAClientNoCompatibleRail(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-d")
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft3"}})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		k, v := []byte("d"+strconv.Itoa(i)), rnd(5000, uint64(i))
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		got := make([]byte, len(v))
		if err := c.Get(ctx, k, got); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %d: %v", i, err)
		}
	}
	if m := c.TransportMode(); !strings.Contains(m, "no compatible RDMA rail") {
		t.Fatalf("mode %q", m)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_rdma_client_no_compatible_rail_total"); n != 6 {
		t.Fatalf("no-compatible-rail count %v, want 6", n)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
		t.Fatalf("peer cooled %v times", n)
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 6 {
		t.Fatalf("%v PUT/GET over TCP, want 6", n)
	}
	if n := r.s.metric("dfkv_rdma_v2_conns_opened_total"); n != 0 {
		t.Fatalf("%v RDMA connections opened", n)
	}
}

// A rail that fails before anything is submitted (the client's own soft0 port is down, so
// its device will not open): the rail is quarantined and the op, a PUT included, runs on
// soft1 over RDMA; the server is not cooled.
func TestRDMAClientRailDialFailover(t *testing.T) {
	softOnly(t)
	r := startRailRig(t, "e2e-crails-e")
	if err := soft.WriteFaults(filepath.Join(r.dir, "client-faults"), "soft0 port down\n"); err != nil {
		t.Fatal(err)
	}
	c := r.client(t, client.RDMAOptions{Devices: []string{"soft0", "soft1"}, Primary: "soft0"})
	putGetRound(t, c, "e", 1, 30000, 5)
	if q := clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", "soft0"); q != 1 {
		t.Fatalf("soft0 quarantines %v, want 1", q)
	}
	if a, b := clientRail(t, c, "dfkv_rdma_client_rail_conns_opened_total", "soft0"), clientRail(t, c, "dfkv_rdma_client_rail_ops_total", "soft1"); a != 0 || b != 2 {
		t.Fatalf("soft0 conns %v (want 0), soft1 ops %v (want 2)", a, b)
	}
	if n := r.s.requests(fb.OpPut) + r.s.requests(fb.OpGet); n != 0 {
		t.Fatalf("%v PUT/GET over TCP", n)
	}
	if n := snapMetric(t, c.Snapshot(), "dfkv_client_peer_cooldowns_total"); n != 0 {
		t.Fatalf("peer cooled %v times", n)
	}
}
