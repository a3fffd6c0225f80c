//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/cabi"
	"github.com/dfkv/dfkv/go/internal/testutil/netpart"
)

// Partitions with nftables drop rules, in a network namespace this test creates: the test
// re-runs itself under `unshare --net`, so every process (three etcd members, two
// dfkv_mds, four dfkv_server, the in-process clients) lives on that namespace's loopback and
// the rules touch nothing outside it. Each etcd member runs as its own uid, so that an
// output rule on the socket owner cuts everything a member sends (its raft streams to the
// others included, which no port rule can tell apart). Defaults throughout, as a new user
// runs it: member lease 6 s, client I/O deadline 5 s, connect 1 s, cool-down 3 s.
const (
	partitionChildEnv = "DFKV_E2E_PARTITION_CHILD"
	partGroup         = "part"
	partTable         = "dfkv_part"
	partETCDUID       = 64100 // members run as 64100, 64101, 64102
	// An operation on a cut-off node must end within the client's I/O deadline (5 s), or
	// its connect timeout (1 s) for a fresh connection; the slack is for a loaded machine.
	partOpBound = 5*time.Second + 3*time.Second
)

func TestPartitions(t *testing.T) {
	if os.Getenv(partitionChildEnv) != "" {
		partitionScenario(t)
		return
	}
	// Parent: check what the namespace needs, then run this test again inside one. Where
	// CI is set a missing piece is a failure, not a skip, so CI cannot drop the test.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if err := netpart.Check(ctx); err != nil {
		if os.Getenv("CI") != "" || !errors.Is(err, netpart.ErrUnavailable) {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	etcdBinary(t) // fails when etcd is missing
	cmd := netpart.Command(ctx, append(os.Environ(), partitionChildEnv+"=1", "DFKV_BIN_DIR="+binDir),
		os.Args[0], "-test.run=^TestPartitions$", "-test.v", "-test.count=1", "-test.timeout=5m")
	out, err := cmd.CombinedOutput()
	t.Log("\n" + string(out))
	if err != nil {
		t.Fatalf("partition scenario in the namespace: %v", err)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestPartitions")) {
		t.Fatal("the namespace run did not report a pass")
	}
}

type etcdMember struct {
	name, client, peer string
	uid                int
	cmd                *exec.Cmd
	exited             chan error
	log                *lockedWriter
}

// startEtcd3 runs a three-member etcd, member i as uid partETCDUID+i.
func startEtcd3(t *testing.T, bin string) []*etcdMember {
	t.Helper()
	root, err := os.MkdirTemp("", "dfkv-part-etcd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var ms []*etcdMember
	var cluster []string
	for i := 0; i < 3; i++ {
		m := &etcdMember{name: fmt.Sprintf("e%d", i), client: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			peer: fmt.Sprintf("127.0.0.1:%d", freePort(t)), uid: partETCDUID + i}
		ms = append(ms, m)
		cluster = append(cluster, m.name+"=http://"+m.peer)
	}
	for _, m := range ms {
		dir := filepath.Join(root, m.name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, m.uid, m.uid); err != nil {
			t.Fatal(err)
		}
		m.cmd = exec.Command(bin, "--name", m.name, "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", "http://"+m.client, "--advertise-client-urls", "http://"+m.client,
			"--listen-peer-urls", "http://"+m.peer, "--initial-advertise-peer-urls", "http://"+m.peer,
			"--initial-cluster", strings.Join(cluster, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "dfkv-part", "--log-level", "error")
		m.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(m.uid), Gid: uint32(m.uid)}}
		m.log = &lockedWriter{w: &strings.Builder{}}
		m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
		if err := m.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		m.exited = make(chan error, 1)
		go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(m.cmd, m.exited)
		t.Cleanup(func() {
			_ = m.cmd.Process.Signal(syscall.SIGKILL)
			<-m.exited
		})
	}
	for _, m := range ms {
		waitFor(t, 60*time.Second, "etcd "+m.name+" healthy", func() bool {
			select {
			case err := <-m.exited:
				t.Fatalf("etcd %s exited at start: %v\n%s", m.name, err, m.log)
			default:
			}
			return httpCode(m.client, "/health") == 200
		})
	}
	return ms
}

func readyBody(addr string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func partitionScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tbl, err := netpart.Setup(ctx, partTable)
	if err != nil {
		t.Fatal(err)
	}
	drop := func(t *testing.T, in, out []string) {
		t.Helper()
		if err := tbl.Drop(ctx, in, out); err != nil {
			t.Fatal(err)
		}
	}
	heal := func(t *testing.T) {
		t.Helper()
		if err := tbl.Heal(ctx); err != nil {
			t.Fatal(err)
		}
	}

	etcd := startEtcd3(t, etcdBinary(t))
	var etcdEPs []string
	for _, m := range etcd {
		etcdEPs = append(etcdEPs, m.client)
	}
	mA := startMDSDefaults(t, "mds-a", strings.Join(etcdEPs, ","))
	mB := startMDSDefaults(t, "mds-b", strings.Join(etcdEPs, ","))
	eps := mA.addr + "," + mB.addr
	nodes := map[string]*serverProc{}
	startNode := func(id string) *serverProc {
		s := startServer(t, t.TempDir(), "--cap", "64MiB", "--max-msg", "1MiB", "--mds", eps, "--group", partGroup,
			"--id", id, "--advertise", "127.0.0.1:0")
		nodes[id] = s
		waitFor(t, 30*time.Second, id+" registered (/readyz)", func() bool { return s.httpStatus("/readyz") == 200 })
		return s
	}
	for i := 1; i <= 4; i++ {
		startNode(fmt.Sprintf("n%d", i))
	}
	var hs []*cabi.Handle
	var coolMu sync.Mutex
	cooled := map[string]int{}
	for i := 0; i < 2; i++ {
		ceps := eps
		if i == 1 {
			ceps = mB.addr + "," + mA.addr
		}
		h := cabi.Open(&cabi.Options{StructSize: cabi.OptionsSize, ABIVersion: cabi.ABIVersion, Namespace: []byte("part"),
			MDSEndpoints: ceps, MDSGroup: partGroup, Flags: cabi.FlagRegisterWithMDS, ClientID: fmt.Sprintf("part-%d", i)})
		if h == 0 {
			t.Fatalf("open client %d: %s", i, cabi.LastError())
		}
		t.Cleanup(func() { cabi.Close(h) })
		hd := cabi.Lookup(h)
		hd.SetOnPeerCooldown(func(addr string, _ time.Time) {
			coolMu.Lock()
			cooled[addr]++
			coolMu.Unlock()
		})
		hs = append(hs, hd)
	}
	members := func(n int) func() bool {
		return func() bool {
			for _, h := range hs {
				if len(h.Client().View().Members) != n {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 15*time.Second, "both clients route by the four nodes", members(4))

	const N = 400
	key := func(i int) []byte { return []byte(fmt.Sprintf("part-%d", i)) }
	val := func(i int) []byte { return value(string(key(i)), 1, 256+i%700) }
	for i := 0; i < N; i++ {
		if rc, err := hs[0].Put(key(i), val(i)); rc != 0 {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	owner := func(h *cabi.Handle, i int) string {
		m, _ := h.Client().View().Owner(h.Client().ID(key(i)).Hi)
		return m.ID
	}
	buf := make([]byte, 4096)
	// get reads key i through h: 1 hit (exact bytes, else the test fails), 0 miss or error.
	// No single read may take longer than partOpBound.
	get := func(h *cabi.Handle, i int, phase string) (int, time.Duration) {
		t0 := time.Now()
		ok, n, _ := h.GetAuto(key(i), buf)
		took := time.Since(t0)
		if took > partOpBound {
			t.Fatalf("%s: get of key %d (owner %s) took %v (bound %v)", phase, i, owner(h, i), took, partOpBound)
		}
		if ok == 1 && !bytes.Equal(buf[:n], val(i)) {
			t.Fatalf("%s: WRONG BYTES for key %d (owner %s): %d bytes", phase, i, owner(h, i), n)
		}
		return ok, took
	}
	// readAll reads every key through every client; it returns the hit ratio.
	readAll := func(phase string, skip func(owner string) bool) float64 {
		hits, total := 0, 0
		for _, h := range hs {
			for i := 0; i < N; i++ {
				if skip != nil && skip(owner(h, i)) {
					continue
				}
				ok, _ := get(h, i, phase)
				hits += ok
				total++
			}
		}
		return float64(hits) / float64(total)
	}
	if r := readAll("before", nil); r != 1 {
		t.Fatalf("hit ratio %.3f before any partition", r)
	}

	t.Run("NodeCutOffFromClients", func(t *testing.T) {
		cut := nodes["n2"]
		_, port, _ := strings.Cut(cut.addr, ":")
		// The node keeps its MDS heartbeats (it dials the MDS; only its data port is cut),
		// so it stays in the ring: the clients alone must notice, cool it down and miss.
		drop(t, netpart.PortDrops(port), nil)
		var theirs []int
		for i := 0; i < N && len(theirs) < 20; i++ {
			if owner(hs[0], i) == "n2" {
				theirs = append(theirs, i)
			}
		}
		if len(theirs) == 0 {
			t.Fatal("no key owned by n2")
		}
		start := time.Now()
		for _, h := range hs {
			var slowest time.Duration
			for _, i := range theirs {
				ok, took := get(h, i, "n2 cut off")
				if ok == 1 {
					t.Fatalf("key %d read from n2 through a drop rule", i)
				}
				slowest = max(slowest, took)
			}
			if rc, _ := h.Put(key(theirs[0]), val(theirs[0])); rc == 0 {
				t.Fatal("a put to the cut-off node reported success")
			}
			t.Logf("reads of n2's %d keys: all misses, slowest %v", len(theirs), slowest.Round(time.Millisecond))
		}
		coolMu.Lock()
		n := cooled[cut.addr]
		coolMu.Unlock()
		if n < len(hs) {
			t.Fatalf("%d cool-downs of n2 (%s), want one per client at least", n, cut.addr)
		}
		if r := readAll("n2 cut off, other nodes", func(o string) bool { return o == "n2" }); r != 1 {
			t.Fatalf("hit ratio %.3f on the other nodes while n2 was cut off", r)
		}
		if !members(4)() {
			t.Fatal("n2 left a client's ring though it kept its MDS lease")
		}
		t.Logf("cut off for %v", time.Since(start).Round(time.Millisecond))
		heal(t)
		healed := time.Now()
		waitFor(t, 20*time.Second, "n2's keys hit again after the heal", func() bool {
			for _, h := range hs {
				for _, i := range theirs {
					if ok, _ := get(h, i, "n2 healed"); ok != 1 {
						return false
					}
				}
			}
			return true
		})
		t.Logf("n2's keys hit again %v after the heal", time.Since(healed).Round(time.Millisecond))
		if r := readAll("after n2 heal", nil); r != 1 {
			t.Fatalf("hit ratio %.3f after the heal", r)
		}
	})

	t.Run("MDSCutOffFromEtcd", func(t *testing.T) {
		epoch := hs[0].Client().View().Epoch
		var in []string
		for _, m := range etcd {
			_, p, _ := strings.Cut(m.client, ":")
			in = append(in, netpart.PortDrops(p)...)
		}
		drop(t, in, nil)
		cut := time.Now()
		for _, m := range []*mdsProc{mA, mB} {
			waitFor(t, 20*time.Second, m.name+" /readyz 503", func() bool { return httpCode(m.metricsAddr, "/readyz") == 503 })
			code, body := readyBody(m.metricsAddr)
			t.Logf("%s /readyz %d after %v: %s", m.name, code, time.Since(cut).Round(time.Millisecond), body)
			if !strings.Contains(body, "etcd") {
				t.Fatalf("%s /readyz does not say etcd is the cause: %q", m.name, body)
			}
			if httpCode(m.metricsAddr, "/healthz") != 200 {
				t.Fatalf("%s /healthz must stay 200 while etcd is unreachable", m.name)
			}
		}
		// The replicas keep serving the last good ring: the clients keep it and every read hits.
		if r := readAll("MDS cut off from etcd", nil); r != 1 {
			t.Fatalf("hit ratio %.3f while the MDS was cut off from etcd", r)
		}
		for i, h := range hs {
			if v := h.Client().View(); v.Epoch != epoch || len(v.Members) != 4 {
				t.Fatalf("client %d changed its ring while the MDS was cut off: %v", i, viewIDs(v))
			}
		}
		t.Logf("MDS cut off from etcd for %v", time.Since(cut).Round(time.Millisecond))
		heal(t)
		healed := time.Now()
		for _, m := range []*mdsProc{mA, mB} {
			waitFor(t, 30*time.Second, m.name+" /readyz 200 after the heal", func() bool { return httpCode(m.metricsAddr, "/readyz") == 200 })
		}
		waitFor(t, 30*time.Second, "four nodes in every client's ring after the heal", members(4))
		for id, s := range nodes {
			waitFor(t, 30*time.Second, id+" ready after the heal", func() bool { return s.httpStatus("/readyz") == 200 })
		}
		t.Logf("MDS ready and rings whole %v after the heal", time.Since(healed).Round(time.Millisecond))
		waitFor(t, 20*time.Second, "every key hits after the heal", func() bool { return readAll("after etcd heal", nil) == 1 })
	})

	t.Run("EtcdMemberIsolated", func(t *testing.T) {
		// Isolate the leader: the hardest member to lose.
		var leader *etcdMember
		waitFor(t, 20*time.Second, "an etcd leader", func() bool {
			for _, m := range etcd {
				id, l, err := netpart.EtcdStatus(ctx, m.client)
				if err == nil && id == l && l != "" {
					leader = m
					return true
				}
			}
			return false
		})
		_, cp, _ := strings.Cut(leader.client, ":")
		_, pp, _ := strings.Cut(leader.peer, ":")
		drop(t, []string{"tcp dport { " + cp + ", " + pp + " } drop"}, []string{"meta skuid " + strconv.Itoa(leader.uid) + " drop"})
		cut := time.Now()
		// The other two elect a leader; both MDS replicas must be ready again on them and
		// membership must keep moving: a join reaches every client.
		for _, m := range []*mdsProc{mA, mB} {
			waitFor(t, 30*time.Second, m.name+" /readyz 200 with the leader isolated", func() bool { return httpCode(m.metricsAddr, "/readyz") == 200 })
		}
		if r := readAll("etcd leader isolated", nil); r != 1 {
			t.Fatalf("hit ratio %.3f with an etcd member isolated", r)
		}
		startNode("n5")
		joined := time.Now()
		waitFor(t, 30*time.Second, "n5 in every client's ring with the leader isolated", members(5))
		t.Logf("etcd %s (leader) isolated: n5's join reached both clients %v after it was ready (%v into the isolation)",
			leader.name, time.Since(joined).Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
		heal(t)
		healed := time.Now()
		waitFor(t, 30*time.Second, "the isolated member healthy again", func() bool { return httpCode(leader.client, "/health") == 200 })
		t.Logf("etcd %s healthy %v after the heal", leader.name, time.Since(healed).Round(time.Millisecond))
		// Drain n5 after the heal: its keys go back to their old owners, which still hold them.
		if code := nodes["n5"].stop(); code != 0 {
			t.Fatalf("n5 exit %d after SIGTERM", code)
		}
		delete(nodes, "n5")
		waitFor(t, 15*time.Second, "n5 drained from every client's ring", members(4))
		if r := readAll("after etcd heal", nil); r != 1 {
			t.Fatalf("hit ratio %.3f after the isolated member returned", r)
		}
	})
}
