package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
)

// stallEngine is a real engine whose reads block while stall is set, until the test ends:
// a server that accepted a request and never answers it. entered receives one value per
// stalled read, so a test acts on the event, not on a sleep.
type stallEngine struct {
	store.Engine
	stall   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// startStalling starts a server on a stallEngine.
func startStalling(t *testing.T) (*stallEngine, *testNode) {
	e := &stallEngine{Engine: store.NewMem(64 << 20), entered: make(chan struct{}, 16), release: make(chan struct{})}
	n := startOn(t, "127.0.0.1:0", e, server.Config{})
	t.Cleanup(e.unblock) // runs before the server's shutdown, which waits for its handlers
	return e, n
}

func (e *stallEngine) unblock() { e.once.Do(func() { close(e.release) }) }

func (e *stallEngine) Get(k store.Key, fn func([]byte) error) error {
	if e.stall.Load() {
		e.entered <- struct{}{}
		<-e.release
	}
	return e.Engine.Get(k, fn)
}

// waitStalled cancels (or lets expire) the request once the server holds it.
func (e *stallEngine) waitStalled(t *testing.T) {
	t.Helper()
	select {
	case <-e.entered:
	case <-time.After(10 * time.Second):
		t.Error("the request never reached the server")
	}
}

// A GET the server never answers ends when its context is cancelled, long before the I/O
// deadline, with an error that is context.Canceled; the peer is not put in cool-down and
// the client serves the next call on a fresh connection. Both I/O paths: the netpoller (a
// past deadline wakes the read) and blocking system calls (the socket is shut down).
func TestContextCancelInterruptsStalledGet(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("BlockingIO=%v", blocking), func(t *testing.T) {
			eng, n := startStalling(t)
			// A cool-down would make the follow-up call fail fast: a minute is unmissable.
			c := newClient(t, n.addr, client.Options{BlockingIO: blocking, IOTimeout: time.Minute, Cooldown: time.Minute})
			val := bytes.Repeat([]byte("ctx!"), 64<<10)
			if err := c.Put(context.Background(), []byte("k"), val); err != nil {
				t.Fatal(err)
			}
			eng.stall.Store(true)
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				eng.waitStalled(t)
				cancel()
			}()
			start := time.Now()
			err := c.Get(ctx, []byte("k"), make([]byte, len(val)))
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("stalled get after cancel: %v, want context.Canceled", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("cancel took %v against a one-minute I/O deadline", d)
			}
			if client.IsMiss(err) {
				t.Fatalf("a cancelled call is not a miss: %v", err)
			}

			eng.stall.Store(false)
			buf := make([]byte, len(val))
			if err := c.Get(context.Background(), []byte("k"), buf); err != nil || !bytes.Equal(buf, val) {
				t.Fatalf("get after a cancelled one: %v (bytes equal %v)", err, bytes.Equal(buf, val))
			}
			// The stalled request's reply is on the connection end abandoned; a reused one
			// would now read it as the answer to this request.
			for i := range 4 {
				if err := c.Put(context.Background(), []byte("k2"), val[:1000+i]); err != nil {
					t.Fatal(err)
				}
				if m, err := c.GetAuto(context.Background(), []byte("k2"), buf); err != nil || m != 1000+i {
					t.Fatalf("round %d: n=%d %v", i, m, err)
				}
			}
		})
	}
}

// A context deadline shorter than the I/O deadline wins (context.DeadlineExceeded, which is
// also ErrTimeout: a miss); a shorter I/O deadline wins over a longer context deadline
// (ErrTimeout without context.DeadlineExceeded).
func TestContextDeadlineVersusIOTimeout(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("BlockingIO=%v", blocking), func(t *testing.T) {
			eng, n := startStalling(t)
			if err := newClient(t, n.addr, client.Options{}).Put(context.Background(), []byte("k"), []byte("value")); err != nil {
				t.Fatal(err)
			}
			eng.stall.Store(true)

			c := newClient(t, n.addr, client.Options{BlockingIO: blocking, IOTimeout: time.Minute, Cooldown: time.Minute})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.GetAuto(ctx, []byte("k"), make([]byte, 64))
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrTimeout) || !client.IsMiss(err) {
				t.Fatalf("context deadline first: %v, want context.DeadlineExceeded and ErrTimeout", err)
			}
			eng.waitStalled(t)
			if d, _ := ctx.Deadline(); time.Now().Before(d) {
				t.Fatal("the call returned before its context's deadline")
			}

			c2 := newClient(t, n.addr, client.Options{BlockingIO: blocking, IOTimeout: 300 * time.Millisecond})
			long, cancel2 := context.WithTimeout(context.Background(), time.Minute)
			defer cancel2()
			_, err = c2.GetAuto(long, []byte("k"), make([]byte, 64))
			if !errors.Is(err, client.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("I/O deadline first: %v, want ErrTimeout only", err)
			}
			eng.waitStalled(t)
			if long.Err() != nil {
				t.Fatal("the long context ended first")
			}
		})
	}
}

// A node that accepts and never says anything back: cancelling ends the connection
// handshake (HELLO) too, and an already-cancelled context does no I/O at all.
func TestContextCancelDuringHello(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- nc
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case nc := <-accepted:
				nc.Close()
			default:
				return
			}
		}
	})
	for _, blocking := range []bool{false, true} {
		c := newClient(t, ln.Addr().String(), client.Options{BlockingIO: blocking, IOTimeout: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case nc := <-accepted:
				defer nc.Close()
			case <-time.After(10 * time.Second):
			}
			cancel()
		}()
		if _, err := c.Exist(ctx, []byte("k")); !errors.Is(err, context.Canceled) {
			t.Fatalf("blocking=%v: hello to a silent node after cancel: %v", blocking, err)
		}
		// Nothing is dialled for a context that has already ended.
		if err := c.Put(ctx, []byte("k"), []byte("v")); !errors.Is(err, context.Canceled) {
			t.Fatalf("blocking=%v: put with a cancelled context: %v", blocking, err)
		}
		select {
		case nc := <-accepted:
			nc.Close()
			t.Fatalf("blocking=%v: a cancelled context dialled", blocking)
		default:
		}
	}
}

// A batch whose context is cancelled while the server holds it: every item that did not
// complete carries context.Canceled, and the client serves the next batch.
func TestContextCancelBatch(t *testing.T) {
	eng, n := startStalling(t)
	c := newClient(t, n.addr, client.Options{IOTimeout: time.Minute, Cooldown: time.Minute, BatchConcurrency: 2})
	items := make([]client.Item, 8)
	for i := range items {
		items[i] = client.Item{Key: []byte(fmt.Sprintf("b%d", i)), Value: []byte(fmt.Sprintf("value-%d", i))}
	}
	if err := c.BatchPut(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	eng.stall.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eng.waitStalled(t)
		cancel()
	}()
	for i := range items {
		items[i] = client.Item{Key: items[i].Key, Buf: make([]byte, 7)}
	}
	if err := c.BatchGet(ctx, items, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if !errors.Is(it.Err, context.Canceled) {
			t.Fatalf("item %d: %v, want context.Canceled", i, it.Err)
		}
	}
	items[0].Err = nil
	if err := c.BatchGet(ctx, items, client.Exact); !errors.Is(err, context.Canceled) || !errors.Is(items[0].Err, context.Canceled) {
		t.Fatalf("batch with an ended context: %v (item: %v)", err, items[0].Err)
	}
	eng.stall.Store(false)
	if err := c.BatchGet(context.Background(), items, client.Exact); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil || string(it.Buf) != fmt.Sprintf("value-%d", i) {
			t.Fatalf("item %d after the cancelled batch: %q %v", i, it.Buf, it.Err)
		}
	}
}
