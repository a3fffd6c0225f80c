package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// gatedEngine holds every Put after its payload was read (standing in for the device
// write) until the test releases that key; a key in refuse is refused before reading.
type gatedEngine struct {
	store.Engine
	filled chan uint64 // key Hi, once its payload is read
	mu     sync.Mutex
	gates  map[uint64]chan struct{}
	refuse map[uint64]bool
}

func newGated() *gatedEngine {
	return &gatedEngine{Engine: store.NewMem(64 << 20), filled: make(chan uint64, 64),
		gates: map[uint64]chan struct{}{}, refuse: map[uint64]bool{}}
}

func (g *gatedEngine) gate(k uint64) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[k] == nil {
		g.gates[k] = make(chan struct{})
	}
	return g.gates[k]
}

func (g *gatedEngine) Put(k store.Key, size int, fill func([]byte) error) error {
	g.mu.Lock()
	refuse := g.refuse[k.ID.Hi]
	g.mu.Unlock()
	if refuse {
		return fmt.Errorf("gated: %w", store.ErrBusy)
	}
	buf := make([]byte, size)
	if err := fill(buf); err != nil {
		return err
	}
	g.filled <- k.ID.Hi
	<-g.gate(k.ID.Hi)
	return g.Engine.Put(k, size, func(dst []byte) error { copy(dst, buf); return nil })
}

func (g *gatedEngine) expectFilled(t *testing.T, want ...uint64) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-g.filled:
			if got != w {
				t.Fatalf("payload of key %d read, want %d", got, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("payload of key %d never read: the connection did not read on while a PUT was in flight", w)
		}
	}
}

func (g *gatedEngine) expectNoFill(t *testing.T) {
	t.Helper()
	select {
	case got := <-g.filled:
		t.Fatalf("payload of key %d read beyond the PUT window", got)
	case <-time.After(200 * time.Millisecond): // absence of an event: bounded look
	}
}

// TestPutPipelining: a connection reads the PUTs behind one whose engine write is in
// flight (up to the window), replies leave in request order whatever order the writes
// finish in, each PUT gets its own status, and a non-PUT request waits for the PUTs before
// it.
func TestPutPipelining(t *testing.T) {
	const window = 3
	g := newGated()
	g.refuse[3] = true
	n := startNode(t, server.Config{Engine: g, PutWindow: window})
	rc := dialRaw(t, n.addr)
	var frames []byte
	var b [wire.RequestSize]byte
	put := func(k uint64) {
		(&wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: k}, PayloadLen: 5}).Encode(b[:])
		frames = append(frames, b[:]...)
		frames = append(frames, byte(k), 'v', 'a', 'l', 'u')
	}
	// Keys 1..5 (3 is refused before its payload is read), then an EXIST of key 1.
	for k := uint64(1); k <= 5; k++ {
		put(k)
	}
	(&wire.Request{Op: fb.OpExist, ID: identity.ObjectID{Hi: 1}}).Encode(b[:])
	frames = append(frames, b[:]...)
	if _, err := rc.nc.Write(frames); err != nil {
		t.Fatal(err)
	}
	// 1 and 2 are held in their engine write; 3 is refused (its payload skipped) and
	// counts in the window until its reply is written, behind 1 and 2: so 4 waits.
	g.expectFilled(t, 1, 2)
	g.expectNoFill(t)
	// Finish out of order: 2 first. Nothing may be replied before 1.
	close(g.gate(2))
	_ = rc.nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if resp, err := rc.recv(); err == nil {
		t.Fatalf("reply %+v before the first PUT finished", resp)
	}
	_ = rc.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	close(g.gate(1))
	want := []fb.Status{fb.StatusOk, fb.StatusOk, fb.StatusBusy}
	for i, st := range want {
		resp, err := rc.recv()
		if err != nil || resp.Op != fb.OpPut || resp.Status != st {
			t.Fatalf("reply %d: %+v %v, want PUT %v", i+1, resp, err, st)
		}
	}
	g.expectFilled(t, 4, 5)
	close(g.gate(5))
	close(g.gate(4))
	for i := 4; i <= 5; i++ {
		resp, err := rc.recv()
		if err != nil || resp.Op != fb.OpPut || resp.Status != fb.StatusOk {
			t.Fatalf("reply %d: %+v %v", i, resp, err)
		}
	}
	resp, err := rc.recv()
	if err != nil || resp.Op != fb.OpExist || resp.Status != fb.StatusOk || resp.ValueLen != 5 {
		t.Fatalf("exist after the PUTs: %+v %v", resp, err)
	}
	// The stored bytes are each PUT's own.
	for _, k := range []uint64{1, 2, 4, 5} {
		err := g.Engine.Get(store.Key{ID: identity.ObjectID{Hi: k}}, func(v []byte) error {
			if string(v) != string([]byte{byte(k), 'v', 'a', 'l', 'u'}) {
				return fmt.Errorf("key %d holds %q", k, v)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestPutPipelineShutdown: a drain lets in-flight PUTs finish and reply before the
// connection closes.
func TestPutPipelineShutdown(t *testing.T) {
	g := newGated()
	n := startNode(t, server.Config{Engine: g})
	rc := dialRaw(t, n.addr)
	rc.send(wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 7}, PayloadLen: 3}, []byte("abc"))
	g.expectFilled(t, 7)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- n.srv.Shutdown(ctx)
	}()
	select {
	case err := <-shut:
		t.Fatalf("shutdown returned (%v) with a PUT in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(g.gate(7))
	resp, err := rc.recv()
	if err != nil || resp.Status != fb.StatusOk {
		t.Fatalf("in-flight PUT during drain: %+v %v", resp, err)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if !rc.closed() {
		t.Fatal("connection still open after the drain")
	}
}

// TestPutPipelineTruncatedPayload: the peer goes away in the middle of a PUT's payload
// while an earlier PUT is in flight. The earlier PUT still completes and is stored, the
// truncated one stores nothing, and the server drains without hanging.
func TestPutPipelineTruncatedPayload(t *testing.T) {
	g := newGated()
	n := startNode(t, server.Config{Engine: g})
	rc := dialRaw(t, n.addr)
	rc.send(wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 1}, PayloadLen: 3}, []byte("one"))
	g.expectFilled(t, 1)
	var b [wire.RequestSize]byte
	(&wire.Request{Op: fb.OpPut, ID: identity.ObjectID{Hi: 2}, PayloadLen: 100}).Encode(b[:])
	if _, err := rc.nc.Write(append(b[:], "partial"...)); err != nil {
		t.Fatal(err)
	}
	rc.nc.Close()
	close(g.gate(1))
	close(g.gate(2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := g.Engine.Get(store.Key{ID: identity.ObjectID{Hi: 1}}, func(v []byte) error {
		if string(v) != "one" {
			return fmt.Errorf("key 1 holds %q", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Engine.Stat(store.Key{ID: identity.ObjectID{Hi: 2}}); err == nil {
		t.Fatal("the truncated PUT stored a value")
	}
}
