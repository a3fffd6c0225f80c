//go:build linux

package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// leaseNode is a real server over a small slab engine: 8 MiB, leases up to a quarter.
func leaseNode(t *testing.T) (*client.Client, *slab.Engine) {
	t.Helper()
	eng, err := slab.Open(slab.Config{Dir: t.TempDir(), CapacityBytes: 8 << 20, ExtentBytes: 1 << 20,
		MaxValueBytes: 1 << 20, BufferPoolBytes: 8 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	lim := wire.DefaultLimits()
	lim.MaxValue = 1 << 20
	n := startOn(t, "127.0.0.1:0", eng, server.Config{Limits: lim})
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: n.addr, Weight: 1}})
	c, err := client.New(client.Options{Membership: ms})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, eng
}

func lkey(i int) []byte { return []byte(fmt.Sprintf("lease-key-%d", i)) }
func lval(i, n int) []byte {
	v := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, n/3+1)
	return v[:n]
}

func TestBatchExistLeaseOverTheWire(t *testing.T) {
	c, eng := leaseNode(t)
	const size = 64 << 10
	for i := range 4 {
		if err := c.Put(context.Background(), lkey(i), lval(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	items := []client.Item{{Key: lkey(0)}, {Key: lkey(1)}, {Key: lkey(99)}}
	if err := c.BatchExistLease(context.Background(), items, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, it := range items[:2] {
		if it.Err != nil || !it.Leased || it.N != size {
			t.Fatalf("item %d: err=%v leased=%v n=%d", i, it.Err, it.Leased, it.N)
		}
	}
	if !errors.Is(items[2].Err, client.ErrNotFound) || items[2].Leased {
		t.Fatalf("miss: err=%v leased=%v", items[2].Err, items[2].Leased)
	}
	// An eviction storm of 4x the capacity, through the server.
	for i := 100; i < 100+4*(8<<20)/size; i++ {
		if err := c.Put(context.Background(), lkey(i), lval(i, size)); err != nil {
			t.Fatalf("storm put %d: %v", i, err)
		}
	}
	for i := range 2 {
		buf := make([]byte, size)
		if err := c.Get(context.Background(), lkey(i), buf); err != nil || !bytes.Equal(buf, lval(i, size)) {
			t.Fatalf("leased key %d after the storm: %v", i, err)
		}
	}
	if _, err := c.Exist(context.Background(), lkey(2)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unleased key survived the storm: %v", err)
	}
	if st := eng.LeaseStats(); st.Active != 0 || st.Released != 2 {
		t.Fatalf("reads did not consume the leases: %+v", st)
	}
}

func TestBatchExistLeaseCapAndExpiry(t *testing.T) {
	c, eng := leaseNode(t)
	var now atomic.Int64 // the lease clock, advanced by the test to force expiry
	now.Store(time.Now().UnixNano())
	eng.Leases().SetClock(func() time.Time { return time.Unix(0, now.Load()) })
	const size = 256 << 10
	for i := range 12 {
		if err := c.Put(context.Background(), lkey(i), lval(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	items := make([]client.Item, 12)
	for i := range items {
		items[i].Key = lkey(i)
	}
	if err := c.BatchExistLease(context.Background(), items, 0); err != nil { // 0 = the server's default (10 s)
		t.Fatal(err)
	}
	leased := 0
	for i, it := range items {
		if it.Err != nil || it.N != size {
			t.Fatalf("item %d past the cap must still be a hit: err=%v n=%d", i, it.Err, it.N)
		}
		if it.Leased {
			leased++
		}
	}
	st := eng.LeaseStats()
	if leased == 0 || leased == 12 || int64(leased) != st.Active || st.ActiveBytes > st.LimitBytes {
		t.Fatalf("%d of 12 leased under the cap; stats %+v", leased, st)
	}
	// Past the default lease, the storm may take them all.
	now.Add(int64(wire.DefaultLeaseMS*time.Millisecond + time.Millisecond))
	for i := 100; i < 100+3*(8<<20)/size; i++ {
		if err := c.Put(context.Background(), lkey(i), lval(i, size)); err != nil {
			t.Fatalf("storm put %d: %v", i, err)
		}
	}
	gone := 0
	for i := range 12 {
		if _, err := c.Exist(context.Background(), lkey(i)); errors.Is(err, client.ErrNotFound) {
			gone++
		}
	}
	if gone != 12 {
		t.Fatalf("%d of 12 expired-lease values evicted by a 3x storm", gone)
	}
	if mv, err := c.MaxValue(context.Background()); err != nil || mv != 1<<20 {
		t.Fatalf("MaxValue = %d, %v; want the server's 1 MiB", mv, err)
	}
}
