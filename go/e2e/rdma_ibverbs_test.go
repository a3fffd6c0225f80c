package e2e

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Behaviour of a real verbs stack that the soft NIC does not have, run over ibverbs on
// two devices (DFKV_TEST_RDMA_DEVS=a,b, each on its own netdev, root for ip(8)); the
// Soft-RoCE guest (tools/rdma-vm) provides them. Elsewhere these tests skip, saying so.

// ibverbsRails returns the two rails under test and their netdevs, or skips.
func ibverbsRails(t *testing.T) (devs, netdevs [2]string) {
	t.Helper()
	if rdmaProvider != "ibverbs" {
		t.Skipf("needs the ibverbs provider on two devices (DFKV_TEST_RDMA_PROVIDER=ibverbs DFKV_TEST_RDMA_DEVS=a,b); provider under test is %s", rdmaProvider)
	}
	l := strings.Split(os.Getenv("DFKV_TEST_RDMA_DEVS"), ",")
	if len(l) < 2 || os.Geteuid() != 0 {
		t.Skipf("needs two devices in DFKV_TEST_RDMA_DEVS (%q) and root", os.Getenv("DFKV_TEST_RDMA_DEVS"))
	}
	for i := range 2 {
		devs[i] = l[i]
		b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", l[i], "ports/1/gid_attrs/ndevs/0"))
		if err != nil {
			t.Fatalf("the netdev of %s: %v", l[i], err)
		}
		netdevs[i] = strings.TrimSpace(string(b))
	}
	return devs, netdevs
}

// linkSet runs ip link set dev up|down: the real port event (IBV_EVENT_PORT_ERR / ACTIVE).
func linkSet(t *testing.T, dev, state string) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", "dev", dev, state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s %s: %v %s", dev, state, err, out)
	}
}

// Two rails with a port taken down under traffic by `ip link set … down` (a real
// IBV_EVENT_PORT_ERR on Soft-RoCE): the server publishes the rail down, the client
// quarantines it, a batch GET in flight finishes byte-exact with only its unfinished items
// replayed on the other rail, no GET goes over TCP, a PUT is not replayed; after `up` the
// server publishes the rail healthy again and the client returns to it.
func TestRDMAIbverbsPortDown(t *testing.T) {
	devs, netdevs := ibverbsRails(t)
	t.Cleanup(func() { exec.Command("ip", "link", "set", "dev", netdevs[0], "up").Run() })
	s := startServer(t, t.TempDir(), "--rdma", "--rdma-provider", "ibverbs", "--rdma-dev", devs[0]+","+devs[1],
		"--cap", "512MiB", "--max-msg", "8MiB", "--rdma-segment", "128MiB", "--rdma-health-interval", "50ms",
		"--rdma-health-recovery-samples", "2")
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	// On failure: the client's log, its RDMA series and the server's log say which path
	// (notice, port check, completion error) did or did not act.
	clog := &lockedWriter{w: &strings.Builder{}}
	var c *client.Client
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("client log:\n%s", clog)
		if c != nil {
			for _, l := range strings.Split(string(c.Snapshot()), "\n") {
				if strings.HasPrefix(l, "dfkv_rdma_") && !strings.HasSuffix(l, " 0") {
					t.Logf("client %s", l)
				}
			}
		}
		t.Logf("server log:\n%s", s.log)
	})
	c, err = client.New(client.Options{Membership: ms, Namespace: []byte("portdown"), IOTimeout: fabricTimeout(15 * time.Second),
		Logger: slog.New(slog.NewTextHandler(clog, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RDMA: &client.RDMAOptions{Provider: "ibverbs", Devices: devs[:], Primary: devs[0], Depth: 2, MaxBlock: 4 << 20,
			Notify: true, RailProbeInterval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	const n, size = 24, 1 << 20
	items := make([]client.Item, n)
	for i := range items {
		items[i] = client.Item{Key: []byte("p" + strconv.Itoa(i)), Value: rnd(size, uint64(500+i))}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if items[i].Err != nil {
			t.Fatalf("put %d: %v", i, items[i].Err)
		}
	}
	if m := c.TransportMode(); m != "rdma" {
		t.Fatalf("mode %q", m)
	}
	if b := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", devs[1]); b != 0 {
		t.Fatalf("primary %s healthy, yet %v ops on %s", devs[0], b, devs[1])
	}

	gets := make([]client.Item, n)
	for i := range gets {
		gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, size)}
	}
	served0 := s.metric("dfkv_rdma_v2_get_writes_total")
	done := make(chan error, 1)
	go func() { done <- c.BatchGet(ctx, gets, client.Exact) }()
	waitFor(t, fabricTimeout(30*time.Second), "the batch under way", func() bool { return s.metric("dfkv_rdma_v2_get_writes_total") >= served0+2 })
	linkSet(t, netdevs[0], "down")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("batch get across the port going down: %v", err)
		}
	case <-time.After(fabricTimeout(60 * time.Second)):
		t.Fatal("batch get hung after the port went down")
	}
	for i := range gets {
		if gets[i].Err != nil || !bytes.Equal(gets[i].Buf, items[i].Value) {
			t.Fatalf("item %d: %v, equal %v", i, gets[i].Err, bytes.Equal(gets[i].Buf, items[i].Value))
		}
	}
	waitFor(t, fabricTimeout(10*time.Second), "the server publishes "+devs[0]+" down", func() bool {
		return railMetric(t, s, "dfkv_rdma_rail_healthy", devs[0]) == 0
	})
	replayed := clientRail(t, c, "dfkv_rdma_client_rail_replayed_ops_total", devs[1])
	t.Logf("%v of %d items replayed on %s; %v completion errors on %s; %v windows ended on a down port", replayed, n, devs[1],
		clientRail(t, c, "dfkv_rdma_client_rail_completion_errors_total", devs[0]), devs[0], clientMetric(c, "dfkv_rdma_port_down_breaks_total"))
	if replayed > n-2 {
		t.Fatalf("%v items replayed on %s: more than the unfinished ones", replayed, devs[1])
	}
	if got := s.requests(fb.OpGet) + s.requests(fb.OpBatchGet); got != 0 {
		t.Fatalf("%v GETs over TCP", got)
	}
	// While the port is down, a PUT goes over the other rail, never TCP. rxe raises no QP
	// event and the server's rail notice travels the dead rail, so if the batch ended before
	// the link went down the client first learns it here: its connection on the down port
	// asks the port before posting, posts nothing, quarantines the rail and the PUT, never
	// posted there, runs on the other rail.
	v := rnd(300000, 5)
	ops1 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", devs[1])
	if err := c.Put(ctx, []byte("during"), v); err != nil {
		t.Fatalf("put with %s down: %v", devs[0], err)
	}
	if got := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", devs[1]); got != ops1+1 {
		t.Fatalf("%s ops %v after the PUT, want %v", devs[1], got, ops1+1)
	}
	if got := s.requests(fb.OpPut); got != 0 {
		t.Fatalf("%v PUTs over TCP", got)
	}
	waitFor(t, fabricTimeout(10*time.Second), "the client quarantines "+devs[0], func() bool {
		return clientRail(t, c, "dfkv_rdma_client_rail_quarantines_total", devs[0]) >= 1
	})

	linkSet(t, netdevs[0], "up")
	waitFor(t, fabricTimeout(20*time.Second), "the server publishes "+devs[0]+" healthy", func() bool {
		return railMetric(t, s, "dfkv_rdma_rail_healthy", devs[0]) == 1
	})
	got := make([]byte, len(v))
	waitFor(t, fabricTimeout(30*time.Second), "the client back on "+devs[0], func() bool {
		ops0 := clientRail(t, c, "dfkv_rdma_client_rail_ops_total", devs[0])
		if err := c.Get(ctx, []byte("during"), got); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get after up: %v", err)
		}
		return clientRail(t, c, "dfkv_rdma_client_rail_ops_total", devs[0]) > ops0
	})
	if r := clientRail(t, c, "dfkv_rdma_client_rail_recoveries_total", devs[0]); r < 1 {
		t.Fatalf("%s back in use with %v recoveries counted", devs[0], r)
	}
}

// A server whose RLIMIT_MEMLOCK (ulimit -l 64, CAP_IPC_LOCK dropped: root would bypass the
// limit) cannot pin its receive segment says so in one line naming the limit and the size:
// with --rdma-dev it refuses to start, without it serves TCP only.
func TestRDMAIbverbsMemlock(t *testing.T) {
	if rdmaProvider != "ibverbs" || rdmaDev == "" || os.Geteuid() != 0 {
		t.Skipf("needs ibverbs on a device (DFKV_TEST_RDMA_DEV) and root; provider under test is %s", rdmaProvider)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skipf("needs setpriv (util-linux) to drop CAP_IPC_LOCK: %v", err)
	}
	// A dfkv_server that runs under the small limit without CAP_IPC_LOCK.
	wrapped := t.TempDir()
	script := "#!/bin/sh\nulimit -l 64 || exit 97\nexec " + setpriv + " --bounding-set -ipc_lock --inh-caps -ipc_lock " +
		filepath.Join(binDir, "dfkv_server") + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrapped, "dfkv_server"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	const want = "RLIMIT_MEMLOCK is 64 KiB (ulimit -l 64)"

	dir := t.TempDir()
	out, err := exec.Command(filepath.Join(wrapped, "dfkv_server"), "--host", "127.0.0.1", "--port", "0",
		"--dir", filepath.Join(dir, "d"), "--store-engine", "mem", "--cap", "64MiB", "--rdma", "--rdma-provider", "ibverbs",
		"--rdma-dev", rdmaDev, "--rdma-segment", "16MiB").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 97 || ee.ExitCode() == 0 {
		t.Fatalf("dfkv_server --rdma-dev %s under ulimit -l 64: err %v\n%s", rdmaDev, err, out)
	}
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "16 MiB") || !strings.Contains(string(out), "--rdma-dev") {
		t.Fatalf("the refusal does not name the limit and the size:\n%s", out)
	}

	real := binDir
	binDir = wrapped
	s := startServer(t, t.TempDir(), "--rdma", "--rdma-provider", "ibverbs", "--rdma-segment", "16MiB", "--log-level", "info")
	binDir = real
	if _, st := rdmaBootstrap(t, s.addr); st != fb.StatusInvalid {
		t.Fatalf("bootstrap of a server that cannot pin its segment: %s", st)
	}
	if l := s.log.String(); !strings.Contains(l, "rdma not in use") || !strings.Contains(l, want) {
		t.Fatalf("want one line saying RDMA is off for the memlock limit:\n%s", l)
	}
}

// clientMetric reads one unlabelled series of c's snapshot (0 when absent).
func clientMetric(c *client.Client, name string) float64 {
	for _, line := range strings.Split(string(c.Snapshot()), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
