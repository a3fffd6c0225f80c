package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
)

func newClient(t *testing.T, addr string, o client.Options) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n", Addr: addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	o.Membership = ms
	c, err := client.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Every read form lands the same bytes with and without blocking I/O: exact, auto, range,
// scatter into segments, and batches (several chunks in flight), for values from one byte to
// well past the socket and reader buffers.
func TestBlockingIORoundTrips(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(256<<20), server.Config{})
	for _, blocking := range []bool{false, true} {
		t.Run(fmt.Sprintf("BlockingIO=%v", blocking), func(t *testing.T) {
			c := newClient(t, n.addr, client.Options{BlockingIO: blocking, BatchConcurrency: 3})
			rng := rand.New(rand.NewPCG(1, 2))
			for _, size := range []int{1, 4096, 16<<10 - 40, 16 << 10, 100_000, 1 << 20, 5<<20 + 3} {
				key := []byte(fmt.Sprintf("rt-%v-%d", blocking, size))
				val := make([]byte, size)
				for i := range val {
					val[i] = byte(rng.Uint32())
				}
				want := crc32.ChecksumIEEE(val)
				// Put as segments (gathered by one sendmsg with blocking I/O).
				if err := c.PutSegs(context.Background(), key, [][]byte{val[:size/2], val[size/2:]}); err != nil {
					t.Fatalf("put %d: %v", size, err)
				}
				buf := make([]byte, size)
				if err := c.Get(context.Background(), key, buf); err != nil || crc32.ChecksumIEEE(buf) != want {
					t.Fatalf("get %d: %v", size, err)
				}
				big := make([]byte, size+7)
				if m, err := c.GetAuto(context.Background(), key, big); err != nil || m != size || crc32.ChecksumIEEE(big[:m]) != want {
					t.Fatalf("get auto %d: n=%d %v", size, m, err)
				}
				if size > 2 {
					part := make([]byte, size-2)
					if err := c.GetRange(context.Background(), key, 1, part); err != nil || !bytes.Equal(part, val[1:size-1]) {
						t.Fatalf("range %d: %v", size, err)
					}
				}
				segs := [][]byte{make([]byte, size/3), make([]byte, 1), make([]byte, size)}
				if m, err := c.GetAutoSegs(context.Background(), key, segs); err != nil || m != size ||
					crc32.ChecksumIEEE(bytes.Join(segs, nil)[:size]) != want {
					t.Fatalf("segs %d: n=%d %v", size, m, err)
				}
				if err := c.Get(context.Background(), key, make([]byte, size+1)); !errors.Is(err, client.ErrBufferTooSmall) {
					t.Fatalf("exact get with the wrong size: %v", err)
				}
			}
			items := make([]client.Item, 12)
			vals := make([][]byte, len(items))
			for i := range items {
				vals[i] = bytes.Repeat([]byte{byte(i + 1)}, 300_000+i)
				items[i] = client.Item{Key: []byte(fmt.Sprintf("b-%v-%d", blocking, i)), Value: vals[i]}
			}
			if err := c.BatchPut(context.Background(), items); err != nil {
				t.Fatal(err)
			}
			for i := range items {
				if items[i].Err != nil {
					t.Fatalf("batch put %d: %v", i, items[i].Err)
				}
				items[i] = client.Item{Key: items[i].Key, Segs: [][]byte{make([]byte, 1000), make([]byte, len(vals[i]))}}
			}
			if err := c.BatchGet(context.Background(), items, client.Auto); err != nil {
				t.Fatal(err)
			}
			for i := range items {
				got := bytes.Join(items[i].Segs, nil)[:len(vals[i])]
				if items[i].Err != nil || items[i].N != int64(len(vals[i])) || !bytes.Equal(got, vals[i]) {
					t.Fatalf("batch get %d: n=%d %v", i, items[i].N, items[i].Err)
				}
			}
		})
	}
}

// stallProxy relays one server through a listener; once stall is armed, it forwards only
// that many more server bytes per connection and then holds the rest back (a peer that
// hangs mid-reply).
type stallProxy struct {
	ln    net.Listener
	stall atomic.Int64 // -1: relay everything
	done  chan struct{}
	wg    sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, done: make(chan struct{})}
	p.stall.Store(-1)
	go func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(sc, cc); sc.Close() }()
			go func() { defer p.wg.Done(); p.relayDown(cc, sc) }()
		}
	}()
	t.Cleanup(func() { close(p.done); ln.Close(); p.wg.Wait() })
	return p
}

func (p *stallProxy) relayDown(cc, sc net.Conn) {
	defer cc.Close()
	go func() { <-p.done; sc.Close(); cc.Close() }()
	buf := make([]byte, 32<<10)
	left := int64(-1)
	for {
		n, err := sc.Read(buf)
		if n > 0 {
			if left < 0 {
				left = p.stall.Load()
			}
			if left >= 0 {
				n = int(min(int64(n), left))
				left -= int64(n)
			}
			if _, werr := cc.Write(buf[:n]); werr != nil {
				return
			}
			if left == 0 {
				<-p.done // hold the rest back until the test ends
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A peer that stops sending halfway through a large reply: with blocking I/O the caller's
// thread is blocked in recvmsg, and the socket timeouts still end the call at the I/O
// deadline with ErrTimeout, start the cool-down, and never leave partial bytes reported as
// a hit.
func TestBlockingIODeadlineMidReply(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(64<<20), server.Config{})
	p := newStallProxy(t, n.addr)
	const ioTimeout = 400 * time.Millisecond
	c := newClient(t, p.ln.Addr().String(), client.Options{BlockingIO: true, IOTimeout: ioTimeout,
		ConnectTimeout: ioTimeout, Cooldown: time.Minute, PoolSize: 1})
	val := bytes.Repeat([]byte("x"), 4<<20)
	if err := c.Put(context.Background(), []byte("k"), val); err != nil {
		t.Fatal(err)
	}
	p.stall.Store(1 << 20) // connections opened from now on stall after 1 MiB
	c2 := newClient(t, p.ln.Addr().String(), client.Options{BlockingIO: true, IOTimeout: ioTimeout,
		ConnectTimeout: ioTimeout, Cooldown: time.Minute})
	buf := make([]byte, len(val))
	start := time.Now()
	err := c2.Get(context.Background(), []byte("k"), buf)
	took := time.Since(start)
	if !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("stalled reply: want ErrTimeout, got %v", err)
	}
	// The deadline is per request; allow the documented overshoot (an eighth) plus scheduling.
	if took < ioTimeout || took > ioTimeout+ioTimeout/8+300*time.Millisecond {
		t.Fatalf("stalled reply ended after %v (I/O deadline %v)", took, ioTimeout)
	}
	if err := c2.Get(context.Background(), []byte("k"), buf); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("after the timeout the peer should be cooling down: %v", err)
	}
}

// A peer that accepts but never answers the hello: the dial-time exchange is bounded too.
func TestBlockingIOSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		close(done)
		ln.Close()
		mu.Lock()
		for _, nc := range conns {
			nc.Close()
		}
		mu.Unlock()
	})
	const ioTimeout = 300 * time.Millisecond
	c := newClient(t, ln.Addr().String(), client.Options{BlockingIO: true, IOTimeout: ioTimeout, ConnectTimeout: ioTimeout})
	start := time.Now()
	err = c.Get(context.Background(), []byte("k"), make([]byte, 10))
	if !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("silent peer: want ErrTimeout, got %v", err)
	}
	if took := time.Since(start); took > ioTimeout+ioTimeout/8+300*time.Millisecond {
		t.Fatalf("silent peer: call took %v", took)
	}
}
