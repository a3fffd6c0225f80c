package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/cabi"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Rails in the topology, end to end: a real dfkv_server serving RDMA over two soft rails
// (soft0 tier 0, soft1 tier 1) registers with a real dfkv_mds (embedded etcd); the soft
// provider's test-only fault file takes soft1's port down and brings it back. The HLT1
// record, dfkvctl, the epochs and a real MDS client's ring follow.

type railJSON struct {
	Device     string `json:"device"`
	Port       int    `json:"port"`
	PortState  int    `json:"port_state"`
	PhysState  int    `json:"phys_state"`
	QueryOK    bool   `json:"query_ok"`
	NUMANode   int    `json:"numa_node"`
	Tier       int    `json:"tier"`
	Generation uint32 `json:"generation"`
	State      string `json:"state"`
}

type railRingJSON struct {
	MembersEpoch  string `json:"members_epoch"`
	TopologyEpoch string `json:"topology_epoch"`
	Members       []struct {
		ID    string     `json:"id"`
		Rails []railJSON `json:"rails"`
	} `json:"members"`
}

func ctlRails(t *testing.T, eps, group string) railRingJSON {
	t.Helper()
	var r railRingJSON
	if err := json.Unmarshal([]byte(ctl(t, "ring", "--mds", eps, "--group", group, "--json", "--timeout", "2s")), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRDMARailsTopology(t *testing.T) {
	softOnly(t)
	const group = "e2e-rails"
	dir := t.TempDir()
	mds := startMDS(t, "mds", []string{"--etcd", "embedded:" + filepath.Join(dir, "etcd"),
		"--etcd-client-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--etcd-peer-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))})
	faults := filepath.Join(dir, "soft-faults")
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	// The server inherits the fault file; so does this process's own soft provider below
	// (its soft0 carries the RDMA check; soft1 is the rail taken down).
	t.Setenv(soft.FaultsEnv, faults)
	const recovery = 30 // samples at 50 ms: ~1.5 s in Quarantined, long enough to observe
	s := startServer(t, filepath.Join(dir, "node"), "--cap", "256MiB", "--max-msg", "1MiB",
		"--rdma", "--rdma-provider", "soft", "--rdma-dev", "soft0,soft1", "--rdma-tiers", "soft0;soft1",
		"--rdma-primary-dev", "soft0", "--rdma-segment", "64MiB",
		"--rdma-health-interval", "50ms", "--rdma-health-recovery-samples", fmt.Sprint(recovery),
		"--mds", mds.addr, "--group", group, "--id", "r1", "--advertise", "127.0.0.1:0")
	waitFor(t, 15*time.Second, "r1 registered", func() bool { return s.httpStatus("/readyz") == 200 })

	rails := func() (railRingJSON, map[string]railJSON) {
		r := ctlRails(t, mds.addr, group)
		if len(r.Members) != 1 || r.Members[0].ID != "r1" {
			t.Fatalf("members %+v", r.Members)
		}
		m := map[string]railJSON{}
		for _, rl := range r.Members[0].Rails {
			m[rl.Device] = rl
		}
		return r, m
	}
	r0, m := rails()
	want0 := railJSON{Device: "soft0", Port: 1, PortState: 4, PhysState: 5, QueryOK: true, NUMANode: -1, Tier: 0, Generation: 1, State: "healthy"}
	want1 := railJSON{Device: "soft1", Port: 1, PortState: 4, PhysState: 5, QueryOK: true, NUMANode: -1, Tier: 1, Generation: 1, State: "healthy"}
	if len(m) != 2 || m["soft0"] != want0 || m["soft1"] != want1 {
		t.Fatalf("rails at start: %+v", m)
	}
	if s.metric("dfkv_server_rdma_rails_configured") != 2 || s.metric("dfkv_server_rdma_rails_active") != 2 {
		t.Fatal("rail gauges at start")
	}

	// Both rails serve: a connection offering soft1 is served on soft1.
	{
		cp, err := soft.New(soft.Options{Devices: 2, FaultFile: filepath.Join(dir, "no-faults-for-the-client")})
		if err != nil {
			t.Fatal(err)
		}
		rdmaRoundTrip(t, s.addr, cp, "soft1", 1)
		if a, b := railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft0"), railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft1"); a != 0 || b != 1 {
			t.Fatalf("an offer naming soft1: served soft0 %v soft1 %v", a, b)
		}
	}

	// A client following the MDS (the C ABI's Go core) and its ring.
	// Short long polls (DFKV_MDS_LONG_POLL_MS): the test counts completed polls after the rail
	// change, and the default 10 s wait would answer all but the first only at its end.
	t.Setenv("DFKV_MDS_LONG_POLL_MS", "200")
	h := cabi.Open(&cabi.Options{StructSize: cabi.OptionsSize, ABIVersion: cabi.ABIVersion, Namespace: []byte("e2e-rails"),
		MDSEndpoints: mds.addr, MDSGroup: group, MDSPollMS: 100})
	if h == 0 {
		t.Fatalf("open: %s", cabi.LastError())
	}
	defer cabi.Close(h)
	gc := cabi.Lookup(h).Client()
	view0 := gc.View()
	if got := viewIDs(view0); len(got) != 1 || got[0] != "r1" {
		t.Fatalf("client view %v", got)
	}
	changes0 := snapMetric(t, gc.Snapshot(), "dfkv_client_mds_view_changes_total")

	// soft1's port goes down.
	if err := soft.WriteFaults(faults, "soft1 port down\n"); err != nil {
		t.Fatal(err)
	}
	var r1 railRingJSON
	waitFor(t, 10*time.Second, "soft1 published down", func() bool {
		r1, m = rails()
		return m["soft1"].State == "down"
	})
	if want := (railJSON{Device: "soft1", Port: 1, PortState: 1, PhysState: 3, QueryOK: true, NUMANode: -1, Tier: 1, Generation: 2, State: "down"}); m["soft1"] != want {
		t.Fatalf("soft1 down: %+v", m["soft1"])
	}
	if m["soft0"] != want0 {
		t.Fatalf("soft0 moved with soft1: %+v", m["soft0"])
	}
	if r1.TopologyEpoch == r0.TopologyEpoch || r1.MembersEpoch != r0.MembersEpoch {
		t.Fatalf("epochs: members %s -> %s, topology %s -> %s (want topology only)", r0.MembersEpoch, r1.MembersEpoch, r0.TopologyEpoch, r1.TopologyEpoch)
	}
	if s.metric("dfkv_server_rdma_rails_active") != 1 || s.metric("dfkv_rdma_rail_health_changes_total") != 1 {
		t.Fatal("rail metrics after soft1 went down")
	}
	human := ctl(t, "ring", "--mds", mds.addr, "--group", group)
	if !strings.Contains(human, "soft0:t0:healthy,soft1:t1:down") {
		t.Fatalf("dfkvctl ring table:\n%s", human)
	}
	// The client polled the changed topology and kept its ring: placement did not move.
	polls := mdsPolls(t, gc.Snapshot())
	waitFor(t, 10*time.Second, "three client polls after the change", func() bool { return mdsPolls(t, gc.Snapshot()) >= polls+3 })
	if gc.View() != view0 || snapMetric(t, gc.Snapshot(), "dfkv_client_mds_view_changes_total") != changes0 {
		t.Fatal("the client rebuilt its ring for a rail change")
	}

	// The client's NICs: its own soft provider, without the fault file (its soft1 is fine).
	cp, err := soft.New(soft.Options{Devices: 2, FaultFile: filepath.Join(dir, "no-faults-for-the-client")})
	if err != nil {
		t.Fatal(err)
	}
	// soft1 is down on the server: a connection offering soft1 is served on soft0 (tier 0,
	// healthy), byte-exact.
	rdmaRoundTrip(t, s.addr, cp, "soft1", 2)
	if a, b := railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft0"), railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft1"); a != 1 || b != 1 {
		t.Fatalf("with soft1 down, an offer naming soft1: served soft0 %v soft1 %v (want 1, 1: the first went to soft1)", a, b)
	}

	// The port comes back: Quarantined first (a new generation), Healthy after the samples.
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "soft1 published quarantined", func() bool {
		_, m = rails()
		return m["soft1"].State != "down"
	})
	if m["soft1"].State != "quarantined" || m["soft1"].Generation != 3 || m["soft1"].PortState != 4 {
		t.Fatalf("soft1 back up: %+v", m["soft1"])
	}
	var r3 railRingJSON
	waitFor(t, 20*time.Second, "soft1 healthy again", func() bool {
		r3, m = rails()
		return m["soft1"].State == "healthy"
	})
	if m["soft1"].Generation != 4 || r3.MembersEpoch != r0.MembersEpoch || r3.TopologyEpoch == r1.TopologyEpoch || r3.TopologyEpoch == r0.TopologyEpoch {
		t.Fatalf("recovered: %+v, epochs %s/%s", m["soft1"], r3.MembersEpoch, r3.TopologyEpoch)
	}
	if s.metric("dfkv_server_rdma_rails_active") != 2 || s.metric("dfkv_rdma_rail_health_changes_total") != 3 {
		t.Fatal("rail metrics after recovery")
	}
	if gc.View() != view0 {
		t.Fatal("the client rebuilt its ring across the whole down/up cycle")
	}
}

// rdmaRoundTrip bootstraps an RDMA connection to addr from the client's device dev and
// checks a v2 PUT and GET byte-exact.
func rdmaRoundTrip(t *testing.T, addr string, p *soft.Provider, dev string, seed uint64) {
	t.Helper()
	boot, st := rdmaBootstrap(t, addr)
	if st != fb.StatusOk {
		t.Fatalf("bootstrap status %s", st)
	}
	defer boot.Close()
	c, err := onesided.Dial(boot, onesided.Config{Provider: p, Device: dev, MaxBlock: 1 << 20, Depth: 2, IOTimeout: fabricTimeout(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := rnd(300000, seed)
	id := identity.ObjectID{Hi: 7, Lo: seed}
	put := &onesided.Op{Kind: fb.OpPut, Tenant: 3, ID: id, Value: [][]byte{v}}
	get := &onesided.Op{Kind: fb.OpGet, Tenant: 3, ID: id, Dst: [][]byte{make([]byte, len(v))}}
	if err := c.Do(context.Background(), []*onesided.Op{put, get}); err != nil || put.Status != fb.StatusOk || get.Status != fb.StatusOk || !bytes.Equal(get.Dst[0], v) {
		t.Fatalf("rdma from %s: %v %s %s", dev, err, put.Status, get.Status)
	}
}

// railMetric reads one series of a metric with a rail label from the server.
func railMetric(t *testing.T, s *serverProc, name, rail string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := name + `{rail="` + rail + `"} `
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("%s{rail=%q} not exported", name, rail)
	return 0
}

// snapMetric reads one unlabeled series from a client snapshot (Prometheus text format).
func snapMetric(t *testing.T, snap []byte, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(string(snap), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			var v float64
			if _, err := fmt.Sscan(f[1], &v); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("snapshot lacks %s", name)
	return 0
}

// TestRDMARailsBadConfigRefused: rail selection flags that cannot be honoured stop the
// server at start with a message naming the problem.
func TestRDMARailsBadConfigRefused(t *testing.T) {
	softOnly(t)
	cases := []struct {
		args  []string
		want  string
		early bool // refused while parsing flags, before the store opens
	}{
		{[]string{"--rdma-dev", "soft0,soft1", "--rdma-tiers", "soft0;soft9"}, `device "soft9" is not in --rdma-dev soft0,soft1`, true},
		{[]string{"--rdma-dev", "soft0,soft1", "--rdma-tiers", "soft0"}, "leaves out soft1", true},
		{[]string{"--rdma-tiers", "soft0;soft1"}, "needs an explicit --rdma-dev list", true},
		{[]string{"--rdma-dev", "soft0,soft1", "--rdma-primary-dev", "soft2"}, `--rdma-primary-dev "soft2" is not in --rdma-dev`, true},
		{[]string{"--rdma-dev", "soft0,soft0"}, "listed twice", true},
		{[]string{"--rdma-health-recovery-samples", "0"}, "want > 0 and >= 1", true},
		{[]string{"--rdma-dev", "soft0,mlx5_0"}, `no device "mlx5_0" (provider soft has soft0)`, false},
	}
	for _, tc := range cases {
		dir := t.TempDir()
		args := append([]string{"--host", "127.0.0.1", "--port", "0", "--dir", filepath.Join(dir, "data"), "--cap", "64MiB",
			"--store-engine", engine(), "--rdma", "--rdma-provider", "soft", "--rdma-segment", "16MiB"}, tc.args...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "dfkv_server"), args...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Errorf("%v: started (err %v, timed out %v)\n%s", tc.args, err, timedOut, out)
			continue
		}
		// A refusal after the store opened is a log line's err attribute (quotes escaped).
		msg := strings.ReplaceAll(string(out), `\"`, `"`)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%v: message lacks %q:\n%s", tc.args, tc.want, out)
		}
		if opened := strings.Contains(msg, "slab: opened"); tc.early && opened {
			t.Errorf("%v: the store opened before the flags were refused:\n%s", tc.args, out)
		}
	}
}

// TestRDMARailDownAtStart: a listed rail whose port is down at start is published Down and
// not served; when it comes up it is published Healthy (after the recovery samples) and
// then served.
func TestRDMARailDownAtStart(t *testing.T) {
	softOnly(t)
	s, faults := startSoftRailsServer(t, "soft1 port down\n", "--max-msg", "1MiB", "--log-level", "info")
	metrics := func() string {
		resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if m := metrics(); !strings.Contains(m, `dfkv_rdma_rail_healthy{rail="soft1"} 0`) || strings.Contains(m, `dfkv_rdma_rail_active_conns{rail="soft1"}`) {
		t.Fatalf("soft1 down at start should be published unhealthy and not served:\n%s", m)
	}
	if !strings.Contains(s.log.String(), "rdma rail not served") {
		t.Fatalf("no warning for the rail not served:\n%s", s.log)
	}
	cp, err := soft.New(soft.Options{Devices: 2, FaultFile: filepath.Join(t.TempDir(), "no-faults-for-the-client")})
	if err != nil {
		t.Fatal(err)
	}
	rdmaRoundTrip(t, s.addr, cp, "soft1", 1) // served on soft0 meanwhile
	if railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft0") != 1 {
		t.Fatal("the offer naming soft1 did not land on soft0")
	}
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "soft1 healthy and served", func() bool {
		m := metrics()
		return strings.Contains(m, `dfkv_rdma_rail_healthy{rail="soft1"} 1`) && strings.Contains(m, `dfkv_rdma_rail_active_conns{rail="soft1"}`)
	})
	rdmaRoundTrip(t, s.addr, cp, "soft1", 2)
	if a, b := railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft0"), railMetric(t, s, "dfkv_rdma_rail_conns_opened_total", "soft1"); a != 1 || b != 1 {
		t.Fatalf("after recovery: soft0 %v soft1 %v", a, b)
	}
}
