package onesided

import (
	"bytes"
	"context"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Unregistered caller memory moves through transient MRs (no staging copy): registered
// once per buffer while cached, evicted least-recently-used past the byte budget (an entry
// evicted while its op is in flight is deregistered only when that op completes), and with
// the cache off deregistered after every op. Small pieces are still copied.
func TestTransientMRs(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 2})
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 4 << 20, Depth: 4, SegmentBytes: 64 << 20}, store.NewMem(1<<30))
	ctx := context.Background()
	const mib = 1 << 20

	c, _ := dial(t, ts, Config{Provider: p, Device: "soft1", MaxBlock: 4 << 20, Depth: 4, MRCacheBytes: 3 * mib / 2})
	m := c.M
	a, b := randBytes(mib, 1), randBytes(mib, 2)
	// A window of two PUTs: registering b evicts a while a's op is still in flight.
	ops := []*Op{{Kind: fb.OpPut, Tenant: 1, ID: oid(1), Value: [][]byte{a}}, {Kind: fb.OpPut, Tenant: 1, ID: oid(2), Value: [][]byte{b}}}
	if err := c.Do(ctx, ops); err != nil || ops[0].Status != fb.StatusOk || ops[1].Status != fb.StatusOk {
		t.Fatalf("puts: %v %s %s", err, ops[0].Status, ops[1].Status)
	}
	if m.MRAdhocRegs.Load() != 2 || m.MRCacheEvictions.Load() != 1 || m.MRAdhocReleased.Load() != 1 || m.StagedOps.Load() != 0 {
		t.Fatalf("after two puts: regs %d evictions %d released %d staged %d", m.MRAdhocRegs.Load(), m.MRCacheEvictions.Load(), m.MRAdhocReleased.Load(), m.StagedOps.Load())
	}
	if m.MRCacheBytes.Load() != mib {
		t.Fatalf("cache holds %d bytes, want %d", m.MRCacheBytes.Load(), mib)
	}
	// b is cached: reading back into b (and a sub-slice of it) registers nothing new.
	clear(b)
	get := &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(2), Dst: [][]byte{b[:mib/2], b[mib/2:]}}
	if err := c.Do(ctx, []*Op{get}); err != nil || get.Status != fb.StatusOk || !bytes.Equal(b, randBytes(mib, 2)) {
		t.Fatalf("get into cached memory: %v %+v", err, get)
	}
	if m.MRAdhocRegs.Load() != 2 || m.MRCacheHits.Load() != 2 {
		t.Fatalf("get into cached memory: regs %d hits %d", m.MRAdhocRegs.Load(), m.MRCacheHits.Load())
	}
	// A fresh destination gets its own MR; the bytes are a's.
	dst := make([]byte, mib)
	get = &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(1), Dst: [][]byte{dst}}
	if err := c.Do(ctx, []*Op{get}); err != nil || get.N != mib || !bytes.Equal(dst, a) {
		t.Fatalf("get into fresh memory: %v %+v", err, get)
	}
	if m.MRAdhocRegs.Load() != 3 || m.StagedOps.Load() != 0 {
		t.Fatalf("fresh destination: regs %d staged %d", m.MRAdhocRegs.Load(), m.StagedOps.Load())
	}
	// Small values are copied, not registered.
	small := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(3), Value: [][]byte{[]byte("tiny")}}
	if err := c.Do(ctx, []*Op{small}); err != nil || small.Status != fb.StatusOk || m.StagedOps.Load() != 1 || m.MRAdhocRegs.Load() != 3 {
		t.Fatalf("small put: %v %s staged %d regs %d", err, small.Status, m.StagedOps.Load(), m.MRAdhocRegs.Load())
	}

	// Cache off (memory Go does not own): every ad-hoc MR is gone when its op completes.
	off, _ := dial(t, ts, Config{Provider: p, Device: "soft1", MaxBlock: 4 << 20, Depth: 4, MRCacheBytes: -1})
	mo := off.M
	for i := range 3 {
		v := randBytes(2*mib, uint64(10+i))
		put := &Op{Kind: fb.OpPut, Tenant: 2, ID: oid(i), Value: [][]byte{v}}
		out := make([]byte, 2*mib)
		get := &Op{Kind: fb.OpGet, Tenant: 2, ID: oid(i), Dst: [][]byte{out}}
		if err := off.Do(ctx, []*Op{put, get}); err != nil || get.N != 2*mib || !bytes.Equal(out, v) {
			t.Fatalf("uncached %d: %v %+v", i, err, get)
		}
	}
	if mo.MRAdhocRegs.Load() != 6 || mo.MRAdhocReleased.Load() != 6 || mo.MRCacheBytes.Load() != 0 || mo.StagedOps.Load() != 0 {
		t.Fatalf("uncached: regs %d released %d cache bytes %d staged %d", mo.MRAdhocRegs.Load(), mo.MRAdhocReleased.Load(), mo.MRCacheBytes.Load(), mo.StagedOps.Load())
	}
	if st := ts.s.Stats(); st["dfkv_rdma_completion_errors_total"] != 0 {
		t.Fatalf("server counters %v", st)
	}
}
