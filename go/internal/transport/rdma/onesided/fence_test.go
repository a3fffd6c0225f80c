package onesided

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// A connection broken by a completion error reports which of its unfinished ops were
// posted (may have run) and which never reached the QP; after a reconnect on the same
// device, a late completion of the old QP generation (the soft NIC's stale_wc fault) lands
// on the new connection's CQ and is dropped and counted, never taken for a new request's.
func TestStaleCompletionFencedAndPostedOps(t *testing.T) {
	faults := filepath.Join(t.TempDir(), "faults")
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	p := softProvider(t, soft.Options{Devices: 2, FaultFile: faults})
	eng := store.NewMem(1 << 28)
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 4, SegmentBytes: 64 << 20}, eng)
	m := new(Metrics)
	cfg := Config{Provider: p, Device: "soft1", MaxBlock: 1 << 20, Depth: 2, Metrics: m}
	ctx := context.Background()
	c1, _ := dial(t, ts, cfg)
	warm := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(100), Value: [][]byte{randBytes(5000, 100)}}
	if err := c1.Do(ctx, []*Op{warm}); err != nil || warm.Status != fb.StatusOk {
		t.Fatalf("put: %v %s", err, warm.Status)
	}
	// Do returns on the server's reply; the PUT's own send completion, the one the stale_wc
	// fault replays on the next QP, can still be on its way. Reap it before going on.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c1.reapSend(); err != nil {
			t.Fatal(err)
		}
		if c1.sqUsed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm PUT's send completion never arrived")
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_ = c1.scq.Wait(wctx)
		cancel()
	}

	// A window of 6 PUTs at depth 2 whose first WR fails. The first was posted; at most
	// depth were; whether the second made it depends on whether the failure (the error
	// completion, or the server closing the bootstrap connection) was seen before its post.
	// What the replay contract promises is checked directly: an op reported unposted never
	// reached the server's store.
	if err := soft.WriteFaults(faults, "soft1 comp_err 1\n"); err != nil {
		t.Fatal(err)
	}
	var ops []*Op
	for i := range 6 {
		ops = append(ops, &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(i), Value: [][]byte{randBytes(3000, uint64(i))}})
	}
	if err := c1.Do(ctx, ops); err == nil {
		t.Fatal("window with a failed WR succeeded")
	}
	posted := 0
	for i, o := range ops {
		if o.Status != fb.StatusUnavailable {
			t.Errorf("op %d: status %s (want Unavailable)", i, o.Status)
		}
		if o.Posted {
			if i != posted {
				t.Errorf("op %d posted after an unposted one", i)
			}
			posted++
			continue
		}
		if _, err := eng.Stat(store.Key{ID: o.ID, Tenant: o.Tenant}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("op %d reported unposted but the server has it (stat: %v)", i, err)
		}
	}
	if posted < 1 || posted > int(cfg.Depth) {
		t.Errorf("%d ops posted (want 1..%d: the failing first, at most a window)", posted, cfg.Depth)
	}
	c1.Close()

	// Reconnect on soft1: the first post finds the old generation's completion first.
	if err := soft.WriteFaults(faults, "soft1 stale_wc 1\n"); err != nil {
		t.Fatal(err)
	}
	c2, _ := dial(t, ts, cfg)
	if c2.Generation() == c1.Generation() {
		t.Fatalf("generation %d reused", c2.Generation())
	}
	var round []*Op
	vals := map[int][]byte{}
	for i := 10; i < 16; i++ {
		vals[i] = randBytes(4000+i, uint64(i))
		round = append(round, &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(i), Value: [][]byte{vals[i]}})
	}
	for i := 10; i < 16; i++ {
		round = append(round, &Op{Kind: fb.OpGet, Tenant: 1, ID: oid(i), Dst: [][]byte{make([]byte, 4000+i)}})
	}
	if err := c2.Do(ctx, round); err != nil {
		t.Fatalf("new generation broke on a stale completion: %v", err)
	}
	for _, o := range round {
		if o.Status != fb.StatusOk {
			t.Fatalf("%s: %s", o.Kind, o.Status)
		}
		if o.Kind == fb.OpGet && !bytes.Equal(o.Dst[0], vals[int(o.ID.Lo)]) {
			t.Fatalf("get %d: wrong bytes", o.ID.Lo)
		}
	}
	if c2.StaleDropped() != 1 || m.StaleCompletions.Load() != 1 {
		t.Fatalf("stale completions dropped: conn %d, metric %d (want 1)", c2.StaleDropped(), m.StaleCompletions.Load())
	}
}
