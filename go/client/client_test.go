package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

type testNode struct {
	addr string
	srv  *server.Server
	eng  store.Engine
}

func startOn(t testing.TB, addr string, eng store.Engine, cfg server.Config) *testNode {
	t.Helper()
	cfg.Engine = eng
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ln interface {
		Addr() net.Addr
	}
	l, err := tcp.Listen(addr)
	for i := 0; err != nil && i < 50; i++ { // the port may linger briefly after a stop
		time.Sleep(20 * time.Millisecond)
		l, err = tcp.Listen(addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	ln = l
	go func() { _ = srv.Serve(l) }()
	n := &testNode{addr: ln.Addr().String(), srv: srv, eng: eng}
	t.Cleanup(func() { n.stop() })
	return n
}

func (n *testNode) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = n.srv.Shutdown(ctx)
}

func TestParseMembers(t *testing.T) {
	ms, err := client.ParseMembers("a=127.0.0.1:1@3, b=[::1]:2,127.0.0.1:3")
	if err != nil || len(ms) != 3 || ms[0].Weight != 3 || ms[1].Addr != "[::1]:2" || ms[2].ID != "127.0.0.1:3" {
		t.Fatalf("%+v %v", ms, err)
	}
	for _, bad := range []string{"", "a=nohost", "a=h:1@0", "=h:1", "a=h:1@x"} {
		if _, err := client.ParseMembers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// With three static members and one killed: its keys miss within the I/O deadline on the
// first call and instantly during the cool-down, the others keep working, and when it comes
// back it is used again without reopening the client.
func TestDeadPeerCooldownAndRejoin(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("BlockingIO=%v", blocking), func(t *testing.T) { testDeadPeerCooldownAndRejoin(t, blocking) })
	}
}

func testDeadPeerCooldownAndRejoin(t *testing.T, blocking bool) {
	var nodes []*testNode
	var members []client.Member
	for i := 0; i < 3; i++ {
		n := startOn(t, "127.0.0.1:0", store.NewMem(64<<20), server.Config{})
		nodes = append(nodes, n)
		members = append(members, client.Member{ID: fmt.Sprintf("n%d", i), Addr: n.addr, Weight: 1})
	}
	ms, _ := client.NewStatic(members)
	const ioTimeout = 300 * time.Millisecond
	const cooldown = 700 * time.Millisecond
	c, err := client.New(client.Options{Membership: ms, IOTimeout: ioTimeout, ConnectTimeout: ioTimeout, Cooldown: cooldown,
		BlockingIO: blocking})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Find keys owned by each node.
	view := ms.View()
	keyOf := map[string][]byte{}
	for i := 0; len(keyOf) < 3 && i < 10000; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		m, _ := view.Owner(c.ID(k).Hi)
		if _, ok := keyOf[m.Addr]; !ok {
			keyOf[m.Addr] = k
		}
	}
	for _, k := range keyOf {
		if err := c.Put(context.Background(), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	dead := nodes[1]
	dead.stop()
	deadKey := keyOf[dead.addr]
	buf := make([]byte, 1)

	start := time.Now()
	err = c.Get(context.Background(), deadKey, buf)
	first := time.Since(start)
	if !client.IsMiss(err) {
		t.Fatalf("dead node: want a miss, got %v", err)
	}
	if first > 2*ioTimeout+200*time.Millisecond {
		t.Fatalf("first call to the dead node took %v (deadline %v)", first, ioTimeout)
	}
	start = time.Now()
	for i := 0; i < 100; i++ {
		if err := c.Get(context.Background(), deadKey, buf); !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("during cool-down: %v", err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("100 cooled-down calls took %v; they should fail fast", d)
	}
	for addr, k := range keyOf {
		if addr == dead.addr {
			continue
		}
		if err := c.Get(context.Background(), k, buf); err != nil {
			t.Fatalf("live node %s: %v", addr, err)
		}
	}
	// Batch over all three: the dead node's item fails alone.
	items := []client.Item{}
	for _, k := range keyOf {
		items = append(items, client.Item{Key: k, Buf: make([]byte, 1)})
	}
	_ = c.BatchGet(context.Background(), items, client.Exact)
	for _, it := range items {
		isDead := string(it.Key) == string(deadKey)
		if (it.Err != nil) != isDead {
			t.Fatalf("batch item %s: %v", it.Key, it.Err)
		}
	}
	// Restart the node on the same address: after the cool-down it is used again.
	startOn(t, dead.addr, dead.eng, server.Config{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Get(context.Background(), deadKey, buf)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted node never used again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(string(c.Snapshot()), "dfkv_client_peer_cooldowns_total") {
		t.Fatal("snapshot lacks the cool-down counter")
	}
}

// A pooled connection the server closed while idle is replayed once on a fresh one.
func TestStalePooledConnectionRetried(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("BlockingIO=%v", blocking), func(t *testing.T) { testStalePooledConnectionRetried(t, blocking) })
	}
}

func testStalePooledConnectionRetried(t *testing.T, blocking bool) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(1<<20), server.Config{IdleTimeout: 100 * time.Millisecond})
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: n.addr, Weight: 1}})
	c, _ := client.New(client.Options{Membership: ms, BlockingIO: blocking})
	defer c.Close()
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// Wait for the event itself, the server reaping the idle pooled connection, rather than
	// sleeping and hoping it happened.
	deadline := time.Now().Add(5 * time.Second)
	for n.srv.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the server kept the idle connection open (%d conns)", n.srv.Conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1)
	if err := c.Get(context.Background(), []byte("k"), buf); err != nil {
		t.Fatalf("get after idle reap: %v", err)
	}
	if !strings.Contains(string(c.Snapshot()), "dfkv_client_stale_retries_total 1") {
		t.Fatalf("expected one stale retry:\n%s", c.Snapshot())
	}
}

func TestClosedClient(t *testing.T) {
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: "127.0.0.1:1", Weight: 1}})
	c, _ := client.New(client.Options{Membership: ms})
	c.Close()
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("put after close: %v", err)
	}
	if err := c.BatchGet(context.Background(), []client.Item{{Key: []byte("k"), Buf: make([]byte, 1)}}, client.Exact); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("batch after close: %v", err)
	}
}
