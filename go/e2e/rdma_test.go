package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RDMA against the real dfkv_server over the soft provider: the server process and this
// test process are the two hosts' NICs.

// rdmaBootstrap opens a data connection and asks for RDMA; it returns the connection and
// the server's status.
func rdmaBootstrap(t *testing.T, addr string) (net.Conn, wire.Status) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var b [wire.RequestSize]byte
	(&wire.Request{Op: fb.OpRdmaBootstrap}).Encode(b[:])
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	var rb [wire.ResponseSize]byte
	if _, err := io.ReadFull(c, rb[:]); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Time{})
	r, err := wire.DecodeResponse(rb[:])
	if err != nil || r.Op != fb.OpRdmaBootstrap {
		t.Fatalf("bootstrap reply %+v %v", r, err)
	}
	return c, r.Status
}

// tcpGet reads a value over plain TCP (the same store the RDMA path wrote).
func tcpGet(t *testing.T, addr string, tenant uint64, id identity.ObjectID) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var b [wire.RequestSize]byte
	(&wire.Request{Op: fb.OpGet, Tenant: tenant, ID: id}).Encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	var rb [wire.ResponseSize]byte
	if _, err := io.ReadFull(c, rb[:]); err != nil {
		t.Fatal(err)
	}
	r, err := wire.DecodeResponse(rb[:])
	if err != nil || r.Status != fb.StatusOk {
		t.Fatalf("tcp get: %+v %v", r, err)
	}
	v := make([]byte, r.PayloadLen)
	if _, err := io.ReadFull(c, v); err != nil {
		t.Fatal(err)
	}
	return v
}

func rnd(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 11))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestRDMASoftServer(t *testing.T) {
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "512MiB", "--max-msg", "64MiB", "--rdma-segment", "320MiB",
		"--ram-tier", "--ram-tier-bytes", "256MiB")...)
	boot, st := rdmaBootstrap(t, s.addr)
	if st != fb.StatusOk {
		t.Fatalf("bootstrap status %s", st)
	}
	p := testVerbs(t)
	c, err := onesided.Dial(boot, onesided.Config{Provider: p, MaxBlock: 64 << 20, Depth: 2, IOTimeout: fabricTimeout(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for i, n := range []int{1, 4096, 1<<20 + 1, 64 << 20} {
		v := rnd(n, uint64(i))
		id := identity.ObjectID{Hi: 42, Lo: uint64(i)}
		put := &onesided.Op{Kind: fb.OpPut, Tenant: 9, ID: id, Value: [][]byte{v}}
		if err := c.Do(ctx, []*onesided.Op{put}); err != nil || put.Status != fb.StatusOk {
			t.Fatalf("rdma put %d: %v %s", n, err, put.Status)
		}
		dst := make([]byte, n)
		get := &onesided.Op{Kind: fb.OpGet, Tenant: 9, ID: id, Dst: [][]byte{dst[:n/2], dst[n/2:]}}
		if err := c.Do(ctx, []*onesided.Op{get}); err != nil || get.Status != fb.StatusOk || !bytes.Equal(dst, v) {
			t.Fatalf("rdma get %d: %v %s", n, err, get.Status)
		}
		if n > 1 {
			rng := &onesided.Op{Kind: fb.OpGet, Tenant: 9, ID: id, Offset: 1, Length: uint64(n - 1), Dst: [][]byte{make([]byte, n-1)}}
			if err := c.Do(ctx, []*onesided.Op{rng}); err != nil || !bytes.Equal(rng.Dst[0], v[1:]) {
				t.Fatalf("rdma range %d: %v %s", n, err, rng.Status)
			}
		}
		if got := tcpGet(t, s.addr, 9, id); !bytes.Equal(got, v) {
			t.Fatalf("value of %d bytes put over RDMA reads back differently over TCP", n)
		}
	}
	if s.metric("dfkv_rdma_v2_conns_opened_total") != 1 || s.metric("dfkv_rdma_v2_put_writes_total") != 4 ||
		s.metric("dfkv_rdma_v2_get_writes_total") < 7 || s.metric("dfkv_rdma_completion_errors_total") != 0 {
		t.Fatal("rdma counters did not move as expected")
	}
	// Warm values (1 B .. 1 MiB here) were written straight from the RAM tier's arena.
	if got := s.metric("dfkv_rdma_v2_get_zero_copy_total"); got < 3 {
		t.Fatalf("zero-copy GETs from the RAM tier: %v", got)
	}
	if s.metric("dfkv_rdma_pins_held") != 0 {
		t.Fatal("pins held after every reply completed")
	}
}

func TestRDMAOffAndForcedV1(t *testing.T) {
	// Without --rdma the bootstrap is answered Invalid and the connection stays usable.
	s := startServer(t, t.TempDir())
	c, st := rdmaBootstrap(t, s.addr)
	if st != fb.StatusInvalid {
		t.Fatalf("bootstrap on a TCP-only server: %s", st)
	}
	var b [wire.RequestSize]byte
	(&wire.Request{Op: fb.OpPing}).Encode(b[:])
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(b[:])
	var rb [wire.ResponseSize]byte
	if _, err := io.ReadFull(c, rb[:]); err != nil {
		t.Fatalf("ping after a refused bootstrap: %v", err)
	}
	c.Close()

	// A forced-v1 server tells an auto client to reconnect offering v1.
	s1 := startServer(t, t.TempDir(), rdmaArgs("--rdma-server-protocol", "1")...)
	boot, st := rdmaBootstrap(t, s1.addr)
	if st != fb.StatusOk {
		t.Fatalf("bootstrap: %s", st)
	}
	p := testVerbs(t)
	if _, err := onesided.Dial(boot, onesided.Config{Provider: p}); !errors.Is(err, dcp.ErrFallbackV1) {
		t.Fatalf("auto client against a forced-v1 server: %v", err)
	}
}

// --rdma over ibverbs follows what this machine has: without a usable device it says why
// in one line and TCP serves; with one (hardware, Soft-RoCE in the guest) it serves RDMA.
// Naming a device that does not exist refuses the start either way.
func TestRDMAUnavailable(t *testing.T) {
	usable := ""
	devs, derr := ibverbs.New(ibverbs.Options{}).Devices()
	for _, d := range devs {
		if _, ok := d.ActivePort(); ok {
			usable = d.Name
			break
		}
	}
	s := startServer(t, t.TempDir(), "--rdma", "--rdma-provider", "ibverbs", "--log-level", "info")
	_, st := rdmaBootstrap(t, s.addr)
	if usable == "" {
		t.Logf("no usable RDMA device here (%v): expecting TCP only", derr)
		if st != fb.StatusInvalid {
			t.Fatalf("bootstrap without a usable device: %s", st)
		}
		if n := strings.Count(s.log.String(), "rdma not in use"); n != 1 {
			t.Fatalf("want one line saying why RDMA is off, got %d:\n%s", n, s.log)
		}
	} else {
		t.Logf("RDMA device %s has an ACTIVE port: expecting RDMA served", usable)
		if st != fb.StatusOk {
			t.Fatalf("bootstrap with device %s: %s\n%s", usable, st, s.log)
		}
		if strings.Contains(s.log.String(), "rdma not in use") || !strings.Contains(s.log.String(), "rdma serving") {
			t.Fatalf("with device %s the server should serve RDMA:\n%s", usable, s.log)
		}
	}
	const missing = "dfkv-no-such-dev0"
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "dfkv_server"), "--host", "127.0.0.1", "--port", "0", "--dir", filepath.Join(dir, "d"),
		"--store-engine", "mem", "--cap", "64MiB", "--rdma-dev", missing)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("dfkv_server --rdma-dev %s (no such device): err %v\n%s", missing, err, out)
	}
	if !strings.Contains(string(out), "rdma: --rdma-dev "+missing) {
		t.Fatalf("refusal does not say why:\n%s", out)
	}
}

// The Go client with RDMA on: values up to its declared block move over RDMA, larger ones
// and servers without RDMA over TCP; TransportMode says which and why.
func TestRDMAGoClient(t *testing.T) {
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "512MiB", "--max-msg", "64MiB")...)
	plain := startServer(t, t.TempDir(), "--cap", "512MiB", "--max-msg", "64MiB")
	for _, srv := range []*serverProc{s, plain} {
		ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: srv.addr, Weight: 100}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(client.Options{Membership: ms, Namespace: []byte("rdma"), IOTimeout: fabricTimeout(30 * time.Second),
			RDMA: &client.RDMAOptions{Provider: rdmaProvider}})
		if err != nil {
			t.Fatal(err)
		}
		reg := make([]byte, 1<<20)
		if err := c.RegisterMemory(reg); err != nil {
			t.Fatal(err)
		}
		for i, n := range []int{1, 4096, 1<<20 + 1, 4 << 20, 64 << 20} {
			key := []byte{byte(i)}
			v := rnd(n, uint64(50+i))
			if err := c.Put(context.Background(), key, v); err != nil {
				t.Fatalf("put %d: %v", n, err)
			}
			got := make([]byte, n)
			if err := c.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %d: %v", n, err)
			}
			if m, err := c.GetAuto(context.Background(), key, make([]byte, n+10)); err != nil || m != n {
				t.Fatalf("get auto %d: %d %v", n, m, err)
			}
			if _, err := c.GetAuto(context.Background(), key, make([]byte, max(n-1, 1))); n > 1 && !errors.Is(err, client.ErrBufferTooSmall) {
				t.Fatalf("get auto into a short buffer: %v", err)
			}
			if ln, err := c.Exist(context.Background(), key); err != nil || ln != int64(n) {
				t.Fatalf("exist %d: %d %v", n, ln, err)
			}
		}
		// Registered memory: zero-copy in both directions.
		copy(reg, rnd(len(reg), 7))
		want := append([]byte(nil), reg...)
		if err := c.Put(context.Background(), []byte("reg"), reg); err != nil {
			t.Fatal(err)
		}
		clear(reg)
		if err := c.Get(context.Background(), []byte("reg"), reg); err != nil || !bytes.Equal(reg, want) {
			t.Fatalf("registered get: %v", err)
		}
		if err := c.Remove(context.Background(), []byte("reg")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exist(context.Background(), []byte("reg")); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("exist after remove: %v", err)
		}
		mode := c.TransportMode()
		snap := string(c.Snapshot())
		c.Close()
		if srv == s && (!strings.Contains(snap, "dfkv_rdma_v2_conns_opened_total 1") || !strings.Contains(snap, "dfkv_rdma_completion_errors_total 0")) {
			t.Fatalf("client snapshot lacks the RDMA counters:\n%s", snap)
		}
		if srv == s {
			if mode != "rdma" {
				t.Fatalf("transport mode %q against an RDMA server", mode)
			}
			// 1 B .. 4 MiB and the registered value went over RDMA; 64 MiB over TCP.
			if got := srv.metric("dfkv_rdma_v2_put_writes_total"); got != 5 {
				t.Fatalf("rdma put writes %v, want 5", got)
			}
		} else if !strings.HasPrefix(mode, "tcp(") || !strings.Contains(mode, "does not serve RDMA") {
			t.Fatalf("transport mode %q against a TCP-only server", mode)
		}
	}
}

// v1 (SEND/RECV): a client forced to v1 (DFKV_RDMA_PROTOCOL=1) against an auto server, and
// an auto client against a forced-v1 server (it reconnects offering v1), byte-exact.
func TestRDMAV1(t *testing.T) {
	auto := startServer(t, t.TempDir(), rdmaArgs()...)
	forced := startServer(t, t.TempDir(), rdmaArgs("--rdma-server-protocol", "1")...)
	for _, tc := range []struct {
		srv      *serverProc
		clientV1 bool
	}{{auto, true}, {forced, false}} {
		ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: tc.srv.addr, Weight: 100}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(client.Options{Membership: ms, IOTimeout: fabricTimeout(30 * time.Second),
			RDMA: &client.RDMAOptions{Provider: rdmaProvider, ForceV1: tc.clientV1}})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range []int{1, 5000, 4 << 20} {
			key := []byte{byte(i)}
			v := rnd(n, uint64(70+i))
			got := make([]byte, n)
			if err := c.Put(context.Background(), key, v); err != nil {
				t.Fatal(err)
			}
			if err := c.Get(context.Background(), key, got); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("v1 get %d: %v", n, err)
			}
			if m, err := c.GetAuto(context.Background(), key, make([]byte, n+1)); err != nil || m != n {
				t.Fatalf("v1 get auto %d: %d %v", n, m, err)
			}
		}
		mode := c.TransportMode()
		c.Close()
		if mode != "rdma" {
			t.Fatalf("client v1=%v: transport mode %q", tc.clientV1, mode)
		}
		if tc.srv.metric("dfkv_rdma_v1_conns_opened_total") != 1 || tc.srv.metric("dfkv_rdma_v2_conns_opened_total") != 0 ||
			tc.srv.metric("dfkv_rdma_v1_puts_total") != 3 {
			t.Fatalf("client v1=%v: v1 counters did not move as expected", tc.clientV1)
		}
	}
}
