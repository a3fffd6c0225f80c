package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// A detached socket is greeted (HELLO done, nothing buffered past it) and blocking: a GET
// written on it by hand is answered with the value a Put stored, tenant included.
func TestDialDetachedServesARawGet(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(64<<20), server.Config{})
	c := newClient(t, n.addr, client.Options{BlockingIO: true, Namespace: []byte("ns"), Tenant: []byte("t1")})
	info, ok := c.Detachable()
	if !ok || string(info.Namespace) != "ns" || info.IOTimeout != 5*time.Second || info.PoolSize != 16 {
		t.Fatalf("Detachable = %+v, %v", info, ok)
	}
	val := bytes.Repeat([]byte("detached"), 1000)
	if err := c.Put(context.Background(), []byte("k"), val); err != nil {
		t.Fatal(err)
	}
	fd, err := c.DialDetached(n.addr)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "detached")
	defer f.Close()
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Fatalf("flags %#x, %v: want a blocking socket", fl, err)
	}
	var hdr [wire.RequestSize]byte
	req := wire.Request{Op: fb.OpGet, Flags: wire.FlagExact, Tenant: info.Tenant, ID: c.ID([]byte("k")), Length: uint64(len(val))}
	req.Encode(hdr[:])
	if _, err := f.Write(hdr[:]); err != nil {
		t.Fatal(err)
	}
	var rh [wire.ResponseSize]byte
	if _, err := io.ReadFull(f, rh[:]); err != nil {
		t.Fatal(err)
	}
	resp, err := wire.DecodeResponse(rh[:])
	if err != nil || resp.Status != fb.StatusOk || resp.PayloadLen != uint64(len(val)) {
		t.Fatalf("reply %+v, %v", resp, err)
	}
	got := make([]byte, len(val))
	if _, err := io.ReadFull(f, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("payload differs (%v)", err)
	}
}

// Without blocking I/O, or with RDMA, there is nothing to detach.
func TestDetachableNeedsBlockingTCP(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(8<<20), server.Config{})
	c := newClient(t, n.addr, client.Options{})
	if _, ok := c.Detachable(); ok {
		t.Fatal("netpoller client detachable")
	}
	if _, err := c.DialDetached(n.addr); err == nil {
		t.Fatal("DialDetached worked without blocking I/O")
	}
}

// A failure reported on a detached socket starts the cool-down (the hook sees it, dials
// fail fast) and counts the GET as failed; a dial to a dead member starts it too.
func TestDetachedFailuresCoolThePeer(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(8<<20), server.Config{})
	var mu sync.Mutex
	var cooled []string
	c := newClient(t, n.addr, client.Options{BlockingIO: true, Cooldown: time.Minute,
		OnPeerCooldown: func(addr string, until time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if time.Until(until) < 50*time.Second {
				t.Errorf("cool-down ends in %v, want about a minute", time.Until(until))
			}
			cooled = append(cooled, addr)
		}})
	err := c.DetachedGetFailed(n.addr, os.ErrDeadlineExceeded, 10*time.Millisecond)
	if !errors.Is(err, client.ErrTimeout) {
		t.Fatalf("DetachedGetFailed = %v, want ErrTimeout", err)
	}
	if _, err := c.DialDetached(n.addr); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("dial while cooling = %v, want ErrUnavailable", err)
	}
	if s := string(c.Snapshot()); !bytes.Contains([]byte(s), []byte(`dfkv_client_ops_total{op="get",result="error"} 1`)) {
		t.Fatalf("failed GET not counted:\n%s", s)
	}
	n.stop()
	c2 := newClient(t, n.addr, client.Options{BlockingIO: true, ConnectTimeout: 200 * time.Millisecond, Cooldown: time.Minute,
		OnPeerCooldown: func(addr string, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			cooled = append(cooled, "c2 "+addr)
		}})
	if _, err := c2.DialDetached(n.addr); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("dial to a stopped node = %v, want ErrUnavailable", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cooled) != 2 || cooled[0] != n.addr || cooled[1] != "c2 "+n.addr {
		t.Fatalf("cool-downs seen: %q", cooled)
	}
}

// RecordDetachedGets lands in the same series as the client's own GETs.
func TestRecordDetachedGets(t *testing.T) {
	n := startOn(t, "127.0.0.1:0", store.NewMem(8<<20), server.Config{})
	c := newClient(t, n.addr, client.Options{BlockingIO: true})
	c.RecordDetachedGets(3, 2, 4096, []time.Duration{time.Millisecond, 2 * time.Millisecond})
	s := string(c.Snapshot())
	for _, want := range []string{`dfkv_client_ops_total{op="get",result="ok"} 3`, `dfkv_client_ops_total{op="get",result="miss"} 2`,
		`dfkv_client_value_bytes_total{op="get"} 4096`, `dfkv_client_op_duration_seconds_count{op="get"} 2`,
		`dfkv_client_op_duration_seconds_sum{op="get"} 0.003`} {
		if !bytes.Contains([]byte(s), []byte(want)) {
			t.Errorf("snapshot lacks %s", want)
		}
	}
}
