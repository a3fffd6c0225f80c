package e2e

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/cabi"
)

// Membership change bounds with the DEFAULT configuration, as a new user runs it: a real
// etcd, two dfkv_mds replicas and eight dfkv_server nodes started without any lease or
// poll flag, and clients opened through the C ABI core with only mds_endpoints set. A join
// and a drain (SIGTERM) must reach every client's ring within joinBound, a SIGKILLed node
// must leave every client's ring within deathBound, and afterwards the dead node's keys
// must be served by their new owners.
const (
	joinBound  = 2 * time.Second
	deathBound = 10 * time.Second
	boundGroup = "bounds"
)

// startMDSDefaults runs dfkv_mds with nothing but its addresses and etcd set.
func startMDSDefaults(t *testing.T, name, etcd string) *mdsProc {
	t.Helper()
	port, mport := freePort(t), freePort(t)
	m := &mdsProc{t: t, name: name, addr: fmt.Sprintf("127.0.0.1:%d", port), metricsAddr: fmt.Sprintf("127.0.0.1:%d", mport),
		args: []string{"--host", "127.0.0.1", "--listen", strconv.Itoa(port), "--metrics-port", strconv.Itoa(mport), "--log-level", "warn", "--etcd", etcd}}
	m.start()
	t.Cleanup(m.kill)
	return m
}

func TestMembershipBoundsDefaults(t *testing.T) {
	e := startEtcd(t, etcdBinary(t))
	a := startMDSDefaults(t, "mds-a", e.client)
	b := startMDSDefaults(t, "mds-b", e.client)
	eps := a.addr + "," + b.addr
	nodes := map[string]*serverProc{}
	startNode := func(id string) *serverProc {
		s := startServer(t, t.TempDir(), "--cap", "64MiB", "--max-msg", "1MiB", "--mds", eps, "--group", boundGroup,
			"--id", id, "--advertise", "127.0.0.1:0")
		nodes[id] = s
		waitFor(t, 20*time.Second, id+" registered (/readyz)", func() bool { return s.httpStatus("/readyz") == 200 })
		return s
	}
	for i := 1; i <= 8; i++ {
		startNode(fmt.Sprintf("n%d", i))
	}

	const nClients = 4
	var handles []*cabi.Handle
	for i := 0; i < nClients; i++ {
		// The replicas in both orders, as a fleet's configuration would have them.
		ceps := eps
		if i%2 == 1 {
			ceps = b.addr + "," + a.addr
		}
		h := cabi.Open(&cabi.Options{StructSize: cabi.OptionsSize, ABIVersion: cabi.ABIVersion, Namespace: []byte("bounds"),
			MDSEndpoints: ceps, MDSGroup: boundGroup, Flags: cabi.FlagRegisterWithMDS, ClientID: fmt.Sprintf("bounds-%d", i)})
		if h == 0 {
			t.Fatalf("open client %d: %s", i, cabi.LastError())
		}
		t.Cleanup(func() { cabi.Close(h) })
		handles = append(handles, cabi.Lookup(h))
	}
	waitFor(t, 10*time.Second, "every client routes by the eight nodes", func() bool {
		for _, h := range handles {
			if len(h.Client().View().Members) != 8 {
				return false
			}
		}
		return true
	})
	// everyClient reports how long after start every client's ring satisfied cond.
	everyClient := func(what string, start time.Time, bound time.Duration, cond func(ids []string) bool) time.Duration {
		t.Helper()
		for {
			all := true
			for _, h := range handles {
				all = all && cond(viewIDs(h.Client().View()))
			}
			took := time.Since(start)
			if all {
				t.Logf("%s: every client after %v (bound %v)", what, took.Round(time.Millisecond), bound)
				return took
			}
			if took > bound {
				var views []string
				for i, h := range handles {
					views = append(views, fmt.Sprintf("client %d: %v", i, viewIDs(h.Client().View())))
				}
				t.Fatalf("%s: not seen by every client within %v\n%s", what, bound, strings.Join(views, "\n"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Join: from the moment the node is registered (its /readyz turns 200).
	startNode("n9")
	everyClient("join of n9", time.Now(), joinBound, func(ids []string) bool { return slices.Contains(ids, "n9") })

	// Drain: SIGTERM deregisters before the node drains.
	drained := time.Now()
	go nodes["n9"].stop()
	everyClient("drain of n9", drained, joinBound, func(ids []string) bool { return !slices.Contains(ids, "n9") })

	// Death: keys of n3 fail fast while it is in the ring; it must leave within the bound.
	h0 := handles[0]
	var keys [][]byte
	for i := 0; len(keys) < 40 && i < 100000; i++ {
		k := []byte(fmt.Sprintf("dead-%d", i))
		if m, _ := h0.Client().View().Owner(h0.Client().ID(k).Hi); m.ID == "n3" {
			keys = append(keys, k)
		}
	}
	killed := time.Now()
	nodes["n3"].kill()
	everyClient("SIGKILL of n3", killed, deathBound, func(ids []string) bool { return !slices.Contains(ids, "n3") })
	// The dead node's keys now have live owners: every PUT lands and reads back exactly.
	buf := make([]byte, 4096)
	for i, k := range keys {
		v := value(string(k), 1, 512+i)
		if rc, err := h0.Put(k, v); rc != 0 {
			t.Fatalf("put of a key n3 owned, after n3 left the ring: rc %d %v", rc, err)
		}
		if ok, n, _ := h0.GetAuto(k, buf); ok != 1 || !bytes.Equal(buf[:n], v) {
			t.Fatalf("get of a key n3 owned, after n3 left the ring: ok %d", ok)
		}
	}
}
