package e2e

import (
	"bytes"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// One client's RDMA connections share one opened device: several connections to a real
// dfkv_server (soft provider, RAM tier on) carry concurrent batches from and into one
// registered pool, and the client counts one device, one PD and one registration of the
// pool however many connections use it; the server counts one device, one PD and one
// registration of its RAM-tier arena however many connections it serves. UnregisterMemory
// deregisters the pool once (a second call is ErrInvalid), later ops on that memory still
// move the right bytes, and Close frees the PD and context after the connections.
func TestRDMASharedDevice(t *testing.T) {
	ctx := t.Context()
	s := startServer(t, t.TempDir(), rdmaArgs("--cap", "512MiB", "--max-msg", "4MiB",
		"--rdma-segment", "128MiB", "--rdma-depth", "2", "--ram-tier", "--ram-tier-bytes", "64MiB")...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("rdma-dev"), IOTimeout: fabricTimeout(30 * time.Second),
		BatchConcurrency: 4, RDMA: &client.RDMAOptions{Provider: rdmaProvider, MaxBlock: 1 << 20, Depth: 2, MaxConns: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, block = 16, 256 << 10
	pool := make([]byte, n*block)
	if err := c.RegisterMemory(pool); err != nil {
		t.Fatal(err)
	}
	arenaRegs := s.metric("dfkv_rdma_mr_pool_registrations_total")
	if arenaRegs != 1 {
		t.Fatalf("server arena registrations %v at start, want 1", arenaRegs)
	}
	want := rnd(len(pool), 77)
	key := func(g, i int) []byte { return []byte("d" + strconv.Itoa(g) + "-" + strconv.Itoa(i)) }
	// Concurrent batches (each split in parallel chunks) until several connections are open.
	for round := 0; snapshotValue(c, "dfkv_rdma_v2_conns_opened_total") < 3; round++ {
		if round == 20 {
			t.Fatalf("only %v RDMA connections after %d rounds of concurrent batches", snapshotValue(c, "dfkv_rdma_v2_conns_opened_total"), round)
		}
		copy(pool, want)
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				half := pool[g*len(pool)/2 : (g+1)*len(pool)/2]
				items := make([]client.Item, n/2)
				for i := range items {
					items[i] = client.Item{Key: key(g, i), Value: half[i*block : (i+1)*block]}
				}
				if err := c.BatchPut(ctx, items); err != nil {
					errs <- err
					return
				}
				clear(half)
				for i := range items {
					items[i] = client.Item{Key: key(g, i), Buf: half[i*block : (i+1)*block]}
				}
				if err := c.BatchGet(ctx, items, client.Exact); err != nil {
					errs <- err
					return
				}
				for _, it := range items {
					if it.Err != nil {
						errs <- it.Err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if !bytes.Equal(pool, want) {
			t.Fatalf("round %d: wrong bytes through the registered pool", round)
		}
	}
	for name, v := range map[string]float64{"dfkv_rdma_devices_open": 1, "dfkv_rdma_pds_open": 1,
		"dfkv_rdma_mr_pool_registrations_total": 1, "dfkv_rdma_mr_pool_bytes": float64(len(pool)),
		"dfkv_rdma_staged_ops_total": 0, "dfkv_rdma_mr_adhoc_registrations_total": 0, "dfkv_rdma_completion_errors_total": 0} {
		if got := snapshotValue(c, name); got != v {
			t.Fatalf("client %s = %v, want %v (%v connections)", name, got, v, snapshotValue(c, "dfkv_rdma_v2_conns_opened_total"))
		}
	}
	if s.metric("dfkv_rdma_v2_conns_opened_total") < 3 || s.metric("dfkv_rdma_pds_open") != 1 ||
		s.metric("dfkv_rdma_devices_open") != 1 || s.metric("dfkv_rdma_mr_pool_registrations_total") != arenaRegs {
		t.Fatalf("server: %v connections, %v PDs, %v devices, %v pool registrations", s.metric("dfkv_rdma_v2_conns_opened_total"),
			s.metric("dfkv_rdma_pds_open"), s.metric("dfkv_rdma_devices_open"), s.metric("dfkv_rdma_mr_pool_registrations_total"))
	}

	poolOps := snapshotValue(c, "dfkv_rdma_mr_pool_ops_total")
	if err := c.UnregisterMemory(pool); err != nil {
		t.Fatal(err)
	}
	if err := c.UnregisterMemory(pool); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("second unregister: %v", err)
	}
	if snapshotValue(c, "dfkv_rdma_mr_pool_deregistrations_total") != 1 || snapshotValue(c, "dfkv_rdma_mr_pool_bytes") != 0 {
		t.Fatal("the pool was not deregistered once")
	}
	// The memory is ordinary Go memory again: the same batch moves the right bytes, not as
	// pool ops.
	items := make([]client.Item, n)
	for i := range items {
		items[i] = client.Item{Key: key(9, i), Value: want[i*block : (i+1)*block]}
	}
	if err := c.BatchPut(ctx, items); err != nil {
		t.Fatal(err)
	}
	clear(pool)
	for i := range items {
		items[i] = client.Item{Key: key(9, i), Buf: pool[i*block : (i+1)*block]}
	}
	if err := c.BatchGet(ctx, items, client.Exact); err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Err != nil {
			t.Fatal(it.Err)
		}
	}
	if !bytes.Equal(pool, want) || snapshotValue(c, "dfkv_rdma_mr_pool_ops_total") != poolOps {
		t.Fatalf("after unregister: bytes equal %v, pool ops %v -> %v", bytes.Equal(pool, want), poolOps, snapshotValue(c, "dfkv_rdma_mr_pool_ops_total"))
	}
	c.Close()
	if snapshotValue(c, "dfkv_rdma_pds_open") != 0 || snapshotValue(c, "dfkv_rdma_devices_open") != 0 || snapshotValue(c, "dfkv_rdma_active_conns") != 0 {
		t.Fatal("Close left the PD, the device or a connection open")
	}
}
