package onesided

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Several connections dialled on one Device share its context, PD and pool MRs (the soft
// NIC counts what is open, and refuses an MR of another PD, so a connection that used its
// own PD could not use the pool at all); each moves bytes through the pool concurrently,
// byte-exact. The server, however many connections it serves, has one context and PD.
// Releasing the last reference after the connections frees everything on the device.
func TestDeviceSharedByConnections(t *testing.T) {
	prov, err := soft.New(soft.Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{Provider: prov, Device: "soft0", MaxBlock: 1 << 20, Depth: 4, SegmentBytes: 64 << 20}, store.NewMem(1<<28))
	var m Metrics
	dev, err := OpenDevice(prov, "soft1", &m)
	if err != nil {
		t.Fatal(err)
	}
	const conns, per, block = 4, 8, 64 << 10
	pool, err := verbs.AllocBuffer(conns * per * block)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Free()
	if err := dev.RegisterMemory(pool.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := dev.RegisterMemory(pool.Bytes()); err != nil { // idempotent
		t.Fatal(err)
	}
	var cs []*Client
	for range conns {
		boot, err := net.Dial("tcp", ts.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial(boot, Config{Provider: prov, Shared: dev, MaxBlock: 1 << 20, Depth: 2, Metrics: &m})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	use, _ := prov.Usage("soft1")
	// 3 per-connection MRs (prefixes, staging, replies) each, and the pool once.
	if use.Contexts != 1 || use.PDs != 1 || use.MRs != 3*conns+1 {
		t.Fatalf("client device with %d connections: %+v", conns, use)
	}
	if m.MRPoolRegs.Load() != 1 || m.PDsOpen.Load() != 1 || m.DevicesOpen.Load() != 1 {
		t.Fatalf("pool registrations %d, PDs %d, devices %d", m.MRPoolRegs.Load(), m.PDsOpen.Load(), m.DevicesOpen.Load())
	}
	if use, _ := prov.Usage("soft0"); use.Contexts != 1 || use.PDs != 1 {
		t.Fatalf("server device with %d connections: %+v", conns, use)
	}

	want := randBytes(len(pool.Bytes()), 11)
	copy(pool.Bytes(), want)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := i * per * block
			var puts, gets []*Op
			for j := range per {
				b := pool.Bytes()[base+j*block : base+(j+1)*block]
				puts = append(puts, &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(i*per + j), Value: [][]byte{b}})
				gets = append(gets, &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(i*per + j), Dst: [][]byte{b}})
			}
			if err := c.Do(ctx, puts); err != nil {
				errs <- err
				return
			}
			clear(pool.Bytes()[base : base+per*block])
			if err := c.Do(ctx, gets); err != nil {
				errs <- err
				return
			}
			for _, o := range append(puts, gets...) {
				if o.Status != fb.StatusOk {
					errs <- errors.New("op " + o.Status.String())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !bytes.Equal(pool.Bytes(), want) {
		t.Fatal("wrong bytes through the shared pool")
	}
	if got := m.MRPoolOps.Load(); got != 2*conns*per {
		t.Fatalf("pool ops %d, want %d", got, 2*conns*per)
	}
	if m.MRAdhocRegs.Load() != 0 || m.StagedOps.Load() != 0 || m.MRPoolRegs.Load() != 1 {
		t.Fatalf("adhoc %d staged %d pool registrations %d", m.MRAdhocRegs.Load(), m.StagedOps.Load(), m.MRPoolRegs.Load())
	}

	// Connections close first; the device stays until its owner lets go.
	for _, c := range cs {
		c.Close()
	}
	if use, _ := prov.Usage("soft1"); use.Contexts != 1 || use.PDs != 1 || use.MRs != 1 {
		t.Fatalf("after the connections closed: %+v", use)
	}
	dev.Release()
	if use, _ := prov.Usage("soft1"); use != (soft.Usage{}) {
		t.Fatalf("after the device was released: %+v", use)
	}
	if m.PDsOpen.Load() != 0 || m.DevicesOpen.Load() != 0 || m.MRPoolDeregs.Load() != 1 || m.MRPoolBytes.Load() != 0 {
		t.Fatalf("after release: PDs %d devices %d deregistrations %d bytes %d", m.PDsOpen.Load(), m.DevicesOpen.Load(),
			m.MRPoolDeregs.Load(), m.MRPoolBytes.Load())
	}
	if _, err := Dial(nil, Config{Provider: prov, Shared: dev}); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("dial on a released device: %v", err)
	}
}

// UnregisterMemory of a pool that an in-flight op uses waits for that op (or gives up at
// its context with ErrPoolBusy, the pool still registered and usable); afterwards the range
// is deregistered, ops on it still move the right bytes (not through the pool), and a
// second unregister is ErrNotRegistered.
func TestUnregisterMemoryWaitsForInFlightOps(t *testing.T) {
	prov, err := soft.New(soft.Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{Provider: prov, Device: "soft0", MaxBlock: 1 << 20, Depth: 4, SegmentBytes: 16 << 20}, store.NewMem(1<<26))
	c, _ := dial(t, ts, Config{Provider: prov, Device: "soft1", MaxBlock: 1 << 20, Depth: 2, AdhocMinBytes: 1 << 30})
	dev := c.Device()
	buf := make([]byte, 256<<10)
	if err := c.RegisterMemory(buf); err != nil {
		t.Fatal(err)
	}
	mrs := func() int { u, _ := prov.Usage("soft1"); return u.MRs }
	registered := mrs()

	// An op holding the pool (as between its post and its reply).
	p, _ := dev.acquirePool(buf[100:200])
	if p == nil {
		t.Fatal("pool not found")
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = dev.UnregisterMemory(short, buf)
	cancel()
	if !errors.Is(err, ErrPoolBusy) {
		t.Fatalf("unregister while in use: %v", err)
	}
	if q, _ := dev.acquirePool(buf); q != p || mrs() != registered {
		t.Fatal("a refused unregister left the pool unusable")
	} else {
		dev.releasePool(q)
	}
	done := make(chan error, 1)
	go func() { done <- dev.UnregisterMemory(context.Background(), buf) }()
	deadline := time.Now().Add(10 * time.Second)
	for { // the unregister has begun once new ops no longer get the pool
		q, _ := dev.acquirePool(buf)
		if q == nil {
			break
		}
		dev.releasePool(q)
		if time.Now().After(deadline) {
			t.Fatal("unregister never started")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("unregister returned while an op used the pool: %v", err)
	default:
	}
	if mrs() != registered {
		t.Fatal("the pool was deregistered under an in-flight op")
	}
	dev.releasePool(p)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if mrs() != registered-1 {
		t.Fatalf("MRs %d after unregister, want %d", mrs(), registered-1)
	}
	if err := dev.UnregisterMemory(context.Background(), buf); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("second unregister: %v", err)
	}

	// The memory is ordinary memory again: staged (AdhocMinBytes is huge), byte-exact.
	v := randBytes(len(buf), 5)
	copy(buf, v)
	ctx := context.Background()
	put := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(1), Value: [][]byte{buf}}
	get := &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(1), Dst: [][]byte{buf}}
	if err := c.Do(ctx, []*Op{put}); err != nil || put.Status != fb.StatusOk {
		t.Fatalf("put: %v %s", err, put.Status)
	}
	clear(buf)
	if err := c.Do(ctx, []*Op{get}); err != nil || get.Status != fb.StatusOk || !bytes.Equal(buf, v) {
		t.Fatalf("get: %v %s", err, get.Status)
	}
	if c.M.MRPoolOps.Load() != 0 || c.M.StagedOps.Load() != 2 {
		t.Fatalf("pool ops %d staged %d after unregister", c.M.MRPoolOps.Load(), c.M.StagedOps.Load())
	}
}
