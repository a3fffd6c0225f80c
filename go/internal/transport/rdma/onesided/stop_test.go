package onesided

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// serverGoroutines returns the stacks of goroutines running the server's code.
func serverGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "onesided.(*Server)") || strings.Contains(g, "onesided.(*serverConn)") {
			out = append(out, g)
		}
	}
	return out
}

// Close wakes every connection blocked on its CQ (v2 and v1, idle and mid-window) and
// returns only after every serve goroutine (and its watchers) is gone; the clients then
// fail within their deadline instead of hanging.
func TestCloseWakesCQWaitersAndJoins(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	s, err := NewServer(Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 4, SegmentBytes: 64 << 20}, store.NewMem(1<<28))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The accepted connections stay open until the end: only Close can end their sessions,
	// and what Serve leaves running would still be blocked on them.
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			go s.Serve(context.Background(), c)
		}
	}()
	defer func() {
		ln.Close()
		<-accepted
		for _, c := range held {
			c.Close()
		}
	}()
	ts := &testServer{s: s, ln: ln}
	ctx := context.Background()
	var clients []*Client
	for i, v1 := range []bool{false, false, false, true} {
		c, _ := dial(t, ts, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 4, ForceV1: v1, IOTimeout: 5 * time.Second})
		op := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(i), Value: [][]byte{randBytes(1000, uint64(i))}}
		if err := c.Do(ctx, []*Op{op}); err != nil || op.Status != fb.StatusOk {
			t.Fatalf("put: %v %s", err, op.Status)
		}
		clients = append(clients, c)
	}
	if n := len(serverGoroutines()); n == 0 {
		t.Fatal("no serve goroutines found before Close: the check below would prove nothing")
	}
	closed := make(chan error, 1)
	go func() { closed <- ts.s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return: a CQ waiter was not woken")
	}
	// Serve runs on the test's goroutines: Close joins it up to its return (wg.Done), and the
	// goroutine leaves the frame an instant later, so give it a bounded moment to exit.
	left := serverGoroutines()
	for deadline := time.Now().Add(5 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = serverGoroutines() {
		time.Sleep(time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("%d server goroutines outlived Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	for i, c := range clients {
		op := &Op{Kind: fb.OpExist, Tenant: 1, ID: oid(i)}
		err := c.Do(ctx, []*Op{op})
		if !errors.Is(err, ErrBroken) || op.Status != fb.StatusUnavailable {
			t.Fatalf("client %d after server Close: %v %s", i, err, op.Status)
		}
	}
	if st := ts.s.Stats(); st["dfkv_rdma_active_conns"] != 0 {
		t.Fatalf("active conns %v after Close", st["dfkv_rdma_active_conns"])
	}
}
