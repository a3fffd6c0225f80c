package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// rdmaChildEnv, set to a server address, makes the test binary a client process that PUTs
// and GETs over RDMA until it is killed (rdmaChild); it prints "ready" after its first
// round trip.
const rdmaChildEnv = "DFKV_E2E_RDMA_CHILD"

func rdmaChild(addr string) int {
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: addr, Weight: 100}})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("kill"), IOTimeout: fabricTimeout(10 * time.Second),
		BatchConcurrency: 2, RDMA: &client.RDMAOptions{Provider: rdmaProvider, Device: rdmaDev, MaxBlock: 4 << 20, Depth: 2, MaxConns: 2}})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ctx := context.Background()
	for i := 0; ; i++ {
		v := rnd(1<<20+i, uint64(i))
		k := []byte("child" + strconv.Itoa(i%8))
		got := make([]byte, len(v))
		if err := c.Put(ctx, k, v); err != nil {
			fmt.Println("put:", err)
			return 1
		}
		if err := c.Get(ctx, k, got); err != nil || !bytes.Equal(got, v) {
			fmt.Println("get:", err)
			return 1
		}
		if i == 0 {
			fmt.Println("ready", c.TransportMode())
		}
	}
}

// A client process SIGKILLed in the middle of RDMA traffic: the server notices (its
// bootstrap connection closes), destroys the QPs, returns every receive-segment lease and
// pin, and serves the next client over RDMA byte-exact.
func TestRDMAClientKilled(t *testing.T) {
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "512MiB", "--max-msg", "8MiB", "--rdma-segment", "64MiB")...)
	segment := s.metric("dfkv_rdma_recv_segment_bytes")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe, "-test.run", "^$")
	child.Env = append(os.Environ(), rdmaChildEnv+"="+s.addr)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ready <- sc.Text()
		}
		close(ready)
	}()
	select {
	case line := <-ready:
		if line != "ready rdma" {
			t.Fatalf("child: %q", line)
		}
	case <-time.After(fabricTimeout(30 * time.Second)):
		t.Fatal("the client process did not get going")
	}
	waitMetric(t, "the child's PUTs over RDMA", func() float64 { return s.metric("dfkv_rdma_v2_put_writes_total") }, func(v float64) bool { return v >= 3 })
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	waitFor(t, fabricTimeout(30*time.Second), "the server drops the dead client's connections", func() bool {
		return s.metric("dfkv_rdma_active_conns") == 0 && s.metric("dfkv_rdma_recv_segment_free_bytes") == segment
	})
	waitFor(t, fabricTimeout(10*time.Second), "no pins held", func() bool { return s.metric("dfkv_rdma_pins_held") == 0 })

	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("kill"), IOTimeout: fabricTimeout(10 * time.Second),
		RDMA: &client.RDMAOptions{Provider: rdmaProvider, Device: rdmaDev, MaxBlock: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := rnd(3<<20, 99)
	got := make([]byte, len(v))
	if err := c.Put(t.Context(), []byte("after"), v); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(t.Context(), []byte("after"), got); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get after the kill: %v", err)
	}
	if m := c.TransportMode(); m != "rdma" {
		t.Fatalf("mode %q after the kill", m)
	}
}
