package onesided

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Cross-process tests: this test binary re-executed as the other side ("server" or
// "client"), talking over loopback TCP for the bootstrap and the soft NIC for data.

const roleEnv = "DFKV_ONESIDED_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "server":
		helperServer()
	case "client":
		helperClient(os.Getenv("DFKV_ONESIDED_ADDR"))
	}
	os.Exit(1)
}

func helperServer() {
	p, err := soft.New(soft.Options{})
	if err != nil {
		panic(err)
	}
	s, err := NewServer(Config{Provider: p, MaxBlock: 8 << 20, Depth: 4}, store.NewMem(1<<30))
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr().String())
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); s.Serve(context.Background(), c) }()
	}
}

// helperClient stores one 4 MiB value and then GETs it in windows forever.
func helperClient(addr string) {
	p, err := soft.New(soft.Options{})
	if err != nil {
		panic(err)
	}
	boot, err := net.Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	c, err := Dial(boot, Config{Provider: p, MaxBlock: 8 << 20, Depth: 4})
	if err != nil {
		panic(err)
	}
	v := randBytes(4<<20, 5)
	if err := c.Do(context.Background(), []*Op{{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{v}}}); err != nil {
		panic(err)
	}
	fmt.Println("ready")
	for {
		var ops []*Op
		for range 8 {
			ops = append(ops, &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{make([]byte, 4<<20)}})
		}
		if err := c.Do(context.Background(), ops); err != nil {
			panic(err)
		}
	}
}

func startHelper(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

func firstLine(t *testing.T, sc *bufio.Scanner) string {
	t.Helper()
	ch := make(chan string, 1)
	go func() {
		if sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
	}()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatal("helper exited early")
		}
		return strings.TrimSpace(l)
	case <-time.After(60 * time.Second):
		t.Fatal("helper silent")
	}
	return ""
}

// SIGKILL of the server in the middle of a window: the client gets errors within its I/O
// deadline, never wrong bytes, and does not hang.
func TestServerKilledMidBatch(t *testing.T) {
	cmd, sc := startHelper(t, "server")
	addr := firstLine(t, sc)
	p := softProvider(t, soft.Options{})
	boot, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close()
	c, err := Dial(boot, Config{Provider: p, MaxBlock: 8 << 20, Depth: 4, IOTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := randBytes(4<<20, 6)
	if err := c.Do(context.Background(), []*Op{{Kind: fb.OpPut, ID: oid(1), Value: [][]byte{v}}}); err != nil {
		t.Fatal(err)
	}
	var ops []*Op
	for range 64 {
		ops = append(ops, &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{make([]byte, 4<<20)}})
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Do(context.Background(), ops) }()
	for c.M.Completions.Load() < 3 && time.Since(start) < 30*time.Second {
		time.Sleep(time.Millisecond) // watching a counter, not standing in for an event
	}
	cmd.Process.Kill()
	killed := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, ErrBroken) {
			t.Fatalf("batch across a server kill: %v", err)
		}
		t.Logf("failed %v after the kill: %v", time.Since(killed), err)
	case <-time.After(20 * time.Second):
		t.Fatal("client hung after the server died")
	}
	ok := 0
	for _, op := range ops {
		if op.Status == fb.StatusOk {
			ok++
			if !bytes.Equal(op.Dst[0], v) {
				t.Fatal("a completed GET returned wrong bytes")
			}
		}
	}
	t.Logf("%d of %d GETs completed before the kill", ok, len(ops))
}

// SIGKILL of a client in the middle of GETs: the server tears that connection down,
// releases its pins, lease and MRs, and serves a new client from the same segment.
func TestClientKilledMidGet(t *testing.T) {
	p := softProvider(t, soft.Options{})
	seg := uint64(4 * (8<<20 + 8192))
	ts := startServer(t, Config{Provider: p, MaxBlock: 8 << 20, Depth: 4, SegmentBytes: seg}, store.NewMem(1<<30))
	cmd, sc := startHelper(t, "client", "DFKV_ONESIDED_ADDR="+ts.ln.Addr().String())
	if l := firstLine(t, sc); l != "ready" {
		t.Fatalf("helper said %q", l)
	}
	select {
	case err := <-ts.errs:
		t.Fatalf("server connection ended early: %v", err)
	default:
	}
	deadline := time.Now().Add(30 * time.Second)
	for ts.s.Stats()["dfkv_rdma_v2_get_writes_total"] < 4 && time.Now().Before(deadline) {
		select {
		case err := <-ts.errs:
			t.Fatalf("server connection ended early: %v", err)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	if st := ts.s.Stats(); st["dfkv_rdma_recv_segment_free_bytes"] != 0 || st["dfkv_rdma_active_conns"] != 1 {
		t.Fatalf("while the client runs: %v", st)
	}
	cmd.Process.Kill()
	select {
	case err := <-ts.errs:
		t.Logf("server side ended: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("server did not notice the dead client")
	}
	st := ts.s.Stats()
	if st["dfkv_rdma_active_conns"] != 0 || st["dfkv_rdma_pins_held"] != 0 || st["dfkv_rdma_recv_segment_free_bytes"] != float64(seg) {
		t.Fatalf("after the client died: %v", st)
	}
	// The whole segment is leasable again: a new client works.
	c, _ := dial(t, ts, Config{Provider: softProvider(t, soft.Options{}), MaxBlock: 8 << 20, Depth: 4})
	dst := make([]byte, 4<<20)
	g := &Op{Kind: fb.OpGet, ID: oid(1), Dst: [][]byte{dst}}
	if err := c.Do(context.Background(), []*Op{g}); err != nil || g.Status != fb.StatusOk || !bytes.Equal(dst, randBytes(4<<20, 5)) {
		t.Fatalf("new client after the kill: %v %s", err, g.Status)
	}
}
