package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/store"
)

// slowGet models a storage device's read latency (a cold value read from NVMe): every Get
// waits d before it answers.
type slowGet struct {
	store.Engine
	d time.Duration
}

func (s slowGet) Get(key store.Key, fn func([]byte) error) error {
	time.Sleep(s.d)
	return s.Engine.Get(key, fn)
}

// BenchmarkSGLaneBatchGet reads a batch of 16 two-piece values (2 x 128 KiB, registered)
// over the soft NIC: "lane" (depth 4: four depth-1 lane connections at once), "depth1" (the
// old workaround for overlapping multi-SGE writes: the whole client at depth 1, the batch
// serialised) and "overlap" (the lane off: one depth-4 window on one QP, what the lane
// forbids), each against a RAM engine ("mem") and one whose reads take 1 ms ("get1ms", a
// modelled device latency: the server serves one connection's requests in order, so only
// more connections overlap it). Compare them side by side in one run; the soft NIC's figures
// say nothing about RDMA hardware, only about how much of the batch runs at once.
func BenchmarkSGLaneBatchGet(b *testing.B) {
	const n, piece = 16, 128 << 10
	for _, bc := range []struct {
		name  string
		depth uint32
		off   bool
		lat   time.Duration
	}{{"mem/lane", 4, false, 0}, {"mem/depth1", 1, false, 0}, {"mem/overlap", 4, true, 0},
		{"get1ms/lane", 4, false, time.Millisecond}, {"get1ms/depth1", 1, false, time.Millisecond},
		{"get1ms/overlap", 4, true, time.Millisecond}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.off {
				defer client.SetSGLaneOff(true)()
			}
			gate := &putGate{Engine: slowGet{Engine: store.NewMem(64 << 20), d: bc.lat}}
			node, _ := sgServer(b, gate)
			ms, err := client.NewStatic([]client.Member{{ID: "n", Addr: node.addr, Weight: 1}})
			if err != nil {
				b.Fatal(err)
			}
			c, err := client.New(client.Options{Membership: ms, BatchConcurrency: 1, IOTimeout: 10 * time.Second,
				RDMA: &client.RDMAOptions{Provider: "soft", Depth: bc.depth, MaxBlock: 1 << 20}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			a, bb := make([]byte, n*piece), make([]byte, n*piece)
			ra, rb := make([]byte, n*piece), make([]byte, n*piece)
			for _, m := range [][]byte{a, bb, ra, rb} {
				if err := c.RegisterMemory(m); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			if err := c.BatchPut(ctx, sgItems(n, piece, a, bb, "bench")); err != nil {
				b.Fatal(err)
			}
			gets := sgItems(n, piece, ra, rb, "bench")
			b.SetBytes(n * 2 * piece)
			b.ResetTimer()
			for range b.N {
				if err := c.BatchGet(ctx, gets, client.Exact); err != nil {
					b.Fatal(err)
				}
				for i := range gets {
					if gets[i].Err != nil {
						b.Fatal(gets[i].Err)
					}
				}
			}
		})
	}
}
