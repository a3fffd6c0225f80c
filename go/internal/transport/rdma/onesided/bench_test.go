package onesided

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// BenchmarkMemory compares the three ways caller memory reaches the NIC, side by side in one
// run: a registered pool, transient MRs (cached, as for Go memory; and uncached, as for the
// C ABI: registered and released per op) and staging copies. One iteration is a PUT and a GET
// of the size. Over the soft provider registration is cheap and the copy is what differs;
// on hardware registration costs a system call and page pinning (see docs/RDMA.md).
func BenchmarkMemory(b *testing.B) {
	p := softProvider(b, soft.Options{Devices: 2})
	ts := startServer(b, Config{Provider: p, Device: "soft0", MaxBlock: 4 << 20, Depth: 4, SegmentBytes: 64 << 20}, store.NewMem(1<<30))
	for _, n := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, mode := range []string{"pool", "transient-cached", "transient-uncached", "staged"} {
			b.Run(fmt.Sprintf("%s/%dKiB", mode, n>>10), func(b *testing.B) {
				cfg := Config{Provider: p, Device: "soft1", MaxBlock: 4 << 20, Depth: 4}
				switch mode {
				case "transient-uncached":
					cfg.MRCacheBytes = -1
				case "staged":
					cfg.AdhocMinBytes = 1 << 30
				}
				c, _ := dial(b, ts, cfg)
				src, dst := randBytes(n, 1), make([]byte, n)
				if mode == "pool" {
					if err := c.RegisterMemory(src); err != nil {
						b.Fatal(err)
					}
					if err := c.RegisterMemory(dst); err != nil {
						b.Fatal(err)
					}
				}
				put := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(n), Value: [][]byte{src}}
				get := &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(n), Dst: [][]byte{dst}}
				b.SetBytes(int64(2 * n))
				b.ResetTimer()
				for range b.N {
					if err := c.Do(context.Background(), []*Op{put, get}); err != nil || put.Status != fb.StatusOk || get.N != n {
						b.Fatalf("%v %s %d", err, put.Status, get.N)
					}
				}
				b.StopTimer()
				if mode != "staged" && c.M.StagedOps.Load() != 0 {
					b.Fatalf("%s: %d staged ops", mode, c.M.StagedOps.Load())
				}
			})
		}
	}
}

// BenchmarkNotifyPingPong: one notification each way per iteration (client Notify, server
// Broadcast from a goroutine fed by its handler), natively and over the TCP fallback (a
// server without notification QPs). Over the soft provider "native" runs on the soft NIC,
// itself sockets and goroutines: the ratio says nothing about hardware.
func BenchmarkNotifyPingPong(b *testing.B) {
	for _, native := range []bool{true, false} {
		name := "tcp-fallback"
		if native {
			name = "native"
		}
		b.Run(name, func(b *testing.B) {
			p := softProvider(b, soft.Options{Devices: 2})
			ping, pong := make(chan struct{}, 1), make(chan struct{}, 1)
			scfg := Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2,
				Notify: NotifyConfig{Enabled: native, OOBFallback: true, Handler: func(string, []byte) { ping <- struct{}{} }}}
			ts := startServer(b, scfg, store.NewMem(1<<24))
			c, _ := dial(b, ts, Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2,
				Notify: NotifyConfig{Enabled: true, OOBFallback: true, Handler: func(string, []byte) { pong <- struct{}{} }}})
			if (c.nep != nil) != native {
				b.Fatalf("native endpoint %v", c.nep != nil)
			}
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-ping:
						ts.s.Broadcast(context.Background(), "pong", nil)
					case <-done:
						return
					}
				}
			}()
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if err := c.Notify(ctx, "ping", nil); err != nil {
					b.Fatal(err)
				}
				select {
				case <-pong:
				case <-time.After(10 * time.Second):
					b.Fatal("no pong")
				}
			}
		})
	}
}
