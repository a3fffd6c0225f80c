package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// TestKVEventsThroughMDS: nodes that bind their KV-event PUB socket to 0.0.0.0 advertise a
// dialable endpoint in the topology, and `dfkvctl events --mds` (the real binary) discovers
// every node's stream through the MDS over a real etcd, follows nodes that join after it
// started, prints their tagged stores, and says when a node leaves.
func TestKVEventsThroughMDS(t *testing.T) {
	e := startEtcd(t, etcdBinary(t))
	m := startMDS(t, "mds-a", []string{"--etcd", e.client})
	startNode := func(id string) *serverProc {
		s := startServer(t, t.TempDir(), "--cap", "64MiB", "--max-msg", "1MiB", "--mds", m.addr, "--group", mdsGroup,
			"--id", id, "--advertise", "127.0.0.1:0", "--kv-events", "tcp://0.0.0.0:0", "--kv-events-replay", "tcp://0.0.0.0:0")
		waitFor(t, 15*time.Second, id+" /readyz (registered)", func() bool { return s.httpStatus("/readyz") == 200 })
		return s
	}
	n1 := startNode("n1")

	// The advertised endpoints: --advertise's host with the bound ports, never 0.0.0.0.
	r := ctlRing(t, m.addr)
	if len(r.Members) != 1 {
		t.Fatalf("ring: %+v", r)
	}
	for _, k := range []string{"kv_events", "kv_events_replay"} {
		ep := r.Members[0].Config[k]
		if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || strings.HasSuffix(ep, ":0") {
			t.Fatalf("member config %s = %q, want tcp://127.0.0.1:<bound port>", k, ep)
		}
	}

	out := &lockedWriter{w: &strings.Builder{}}
	cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), "events", "--mds", m.addr, "--group", mdsGroup,
		"--refresh", "300ms", "--timeout", "1s", "--duration", "2m")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	})
	seen := func(what, s string) {
		t.Helper()
		waitFor(t, 20*time.Second, what, func() bool {
			select {
			case <-exited:
				t.Fatalf("dfkvctl events exited: %v\n%s", waitErr, out)
			default:
			}
			return strings.Contains(out.String(), s)
		})
	}
	seen("dfkvctl following n1", "n1\tFOLLOW\t"+r.Members[0].Config["kv_events"])

	// Store and tag on a node until dfkvctl prints the store: a SUB's subscription takes a
	// moment to reach the PUB, and what is published before it is not delivered.
	next := map[string]int{} // every store a new block
	stored := func(s *serverProc, id string) {
		t.Helper()
		c := newClient(t, s.addr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ; ; next[id]++ {
			i := next[id]
			key := []byte(fmt.Sprintf("%s-block-%d", id, i))
			hash := []byte(fmt.Sprintf("engine-hash:%s:%d", id, i))
			if err := c.Put(ctx, key, value(string(key), 1, 4096)); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Tag(ctx, []client.Tag{{Key: key, Model: "m1", BlockHashes: []client.BlockHash{{Bytes: hash}}, BlockSize: 16}}); err != nil || n != 1 {
				t.Fatalf("tag: %d, %v", n, err)
			}
			line := id + "\tseq="
			want := "BlockStored\thashes=" + hex.EncodeToString(hash) + "\tmedium=CPU\ttopic=kv@127.0.0.1:"
			deadline := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				for _, l := range strings.Split(out.String(), "\n") {
					if strings.HasPrefix(l, line) && strings.Contains(l, want) && strings.HasSuffix(l, "@m1") {
						next[id]++
						return
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if ctx.Err() != nil {
				t.Fatalf("dfkvctl events never printed %s's store\n%s", id, out)
			}
		}
	}
	stored(n1, "n1")

	// A node that joins later is discovered at the next topology read.
	n2 := startNode("n2")
	seen("dfkvctl following n2", "n2\tFOLLOW\ttcp://127.0.0.1:")
	stored(n2, "n2")

	// A node that leaves the ring (stopped; its MDS lease lapses) is no longer followed.
	if code := n1.stop(); code != 0 {
		t.Fatalf("n1 exit code %d", code)
	}
	seen("dfkvctl dropping n1", "n1\tLEFT\t")
	stored(n2, "n2") // still following the rest
	t.Logf("dfkvctl events:\n%s", out)
}
