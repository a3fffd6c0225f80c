package onesided

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// gateEngine holds every Get until open is closed (bounded), telling entered each time:
// the server is busy with a request, so its reply is late.
type gateEngine struct {
	store.Engine
	entered chan struct{}
	open    chan struct{}
}

func (g *gateEngine) Get(k store.Key, fn func([]byte) error) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-time.After(30 * time.Second):
	}
	return g.Engine.Get(k, fn)
}

// gatedPair is a server whose engine gate is shut and a client on its own soft provider
// with a fault file, holding six values; depth 2.
func gatedPair(t *testing.T) (*countingServer, *gateEngine, *Client, string, []*Op) {
	t.Helper()
	faults := filepath.Join(t.TempDir(), "faults")
	pc := softProvider(t, soft.Options{FaultFile: faults})
	ps := softProvider(t, soft.Options{})
	eng := &gateEngine{Engine: store.NewMem(1 << 24), entered: make(chan struct{}, 1), open: make(chan struct{})}
	cs := startCountingServer(t, Config{Provider: ps, Depth: 2, MaxBlock: 1 << 20}, eng)
	c, _ := dial(t, cs.testServer, Config{Provider: pc, Depth: 2, MaxBlock: 1 << 20, IOTimeout: 20 * time.Second})
	t.Cleanup(func() { close(eng.open) }) // before the server's cleanup, which waits for its sessions
	ops := make([]*Op, 6)
	for i := range ops {
		v := randBytes(5000, uint64(i))
		if err := c.Do(context.Background(), []*Op{{Kind: fb.OpPut, ID: oid(i), Value: [][]byte{v}}}); err != nil {
			t.Fatal(err)
		}
		ops[i] = &Op{Kind: fb.OpGet, ID: oid(i), Dst: [][]byte{make([]byte, 5000)}}
	}
	return cs, eng, c, faults, ops
}

// doAsync runs c.Do(ops) and returns its result channel.
func doAsync(c *Client, ops []*Op) chan error {
	done := make(chan error, 1)
	go func() { done <- c.Do(context.Background(), ops) }()
	return done
}

// waitDo waits for a window that must end well inside the 20 s I/O timeout.
func waitDo(t *testing.T, done chan error) (error, time.Duration) {
	t.Helper()
	t0 := time.Now()
	select {
	case err := <-done:
		return err, time.Since(t0)
	case <-time.After(10 * time.Second):
		t.Fatal("the window did not end: it waits for the I/O timeout")
		return nil, 0
	}
}

// Soft-RoCE after `ip link set … down`: the port reads DOWN but the QP gets no error and
// its WRs never complete. A window waiting on a late reply asks the port, ends with
// verbs.ErrPortDown well before the I/O timeout, and leaves the ops it had not posted
// unposted (replayable anywhere, PUTs included); a connection on the down port posts
// nothing at all.
func TestPortDownEndsWindowUnposted(t *testing.T) {
	cs, eng, c, faults, ops := gatedPair(t)
	// An idle connection on the same device, dialed while the port was up.
	idle, _ := dial(t, cs.testServer, Config{Provider: c.cfg.Provider, Depth: 2, MaxBlock: 1 << 20, IOTimeout: 20 * time.Second})
	done := doAsync(c, ops)
	select {
	case <-eng.entered: // two requests posted, the server holds the first
	case <-time.After(10 * time.Second):
		t.Fatal("the server never got the first request")
	}
	if err := soft.WriteFaults(faults, "soft0 port stall\n"); err != nil {
		t.Fatal(err)
	}
	err, took := waitDo(t, done)
	if !errors.Is(err, verbs.ErrPortDown) || !errors.Is(err, ErrBroken) {
		t.Fatalf("window ended with %v, want ErrBroken and verbs.ErrPortDown", err)
	}
	for i, op := range ops {
		if op.Status != fb.StatusUnavailable || op.Posted != (i < 2) {
			t.Errorf("op %d: %s posted %v, want Unavailable, posted %v", i, op.Status, op.Posted, i < 2)
		}
	}
	if got := c.M.PortDownBreaks.Load(); got != 1 {
		t.Errorf("port down breaks %d, want 1", got)
	}
	t.Logf("window ended %v after the port went down", took)

	// The idle connection's next window: nothing is posted (a new one is refused at Dial:
	// no ACTIVE port).
	put := &Op{Kind: fb.OpPut, ID: oid(9), Value: [][]byte{randBytes(100, 9)}}
	if err, _ := waitDo(t, doAsync(idle, []*Op{put})); !errors.Is(err, verbs.ErrPortDown) || put.Posted || put.Status != fb.StatusUnavailable {
		t.Fatalf("put on a down port: %v, posted %v, %s", err, put.Posted, put.Status)
	}
	if got := idle.M.PortDownBreaks.Load(); got != 1 {
		t.Errorf("second connection: port down breaks %d, want 1", got)
	}
}

// A server that dies (its end of the bootstrap TCP connection closes) while the client
// waits for a reply: the window ends with ErrPeerClosed at once, not at the I/O timeout
// (on rxe the dead peer's QP answers nothing, so no completion error comes soon).
func TestPeerClosedEndsWindow(t *testing.T) {
	cs, eng, c, _, ops := gatedPair(t) // the server's engine holds the first GET
	done := doAsync(c, ops)
	select {
	case <-eng.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never got the first request")
	}
	var boot *countConn
	select {
	case boot = <-cs.conns:
	default:
		t.Fatal("no server-side connection")
	}
	boot.Close()
	err, took := waitDo(t, done)
	if !errors.Is(err, ErrPeerClosed) || !errors.Is(err, ErrBroken) {
		t.Fatalf("window ended with %v, want ErrBroken and ErrPeerClosed", err)
	}
	for i, op := range ops {
		if op.Status != fb.StatusUnavailable || op.Posted != (i < 2) {
			t.Errorf("op %d: %s posted %v, want Unavailable, posted %v", i, op.Status, op.Posted, i < 2)
		}
	}
	if got := c.M.PortDownBreaks.Load(); got != 0 {
		t.Errorf("port down breaks %d with the port up", got)
	}
	t.Logf("window ended %v after the server's connection closed", took)
}
