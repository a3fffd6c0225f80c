package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/testutil/llmd"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// A publisher dials a subscriber that binds, as llm-d deploys its indexer, and the array
// layout with int hashes is what that indexer decodes: stores index the pod, removals
// unindex it.
func TestLLMDIndexerFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := llmd.Listen(ctx, "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0", Connect: []string{sub.Endpoint()},
		Node: "dfkv-0", Layout: LayoutArray})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Start("")
	parent := wire.BlockHash{Int: 41, Unsigned: true}
	a := &wire.ObjectTag{Model: "llama", BlockHashes: []wire.BlockHash{{Int: -2, Unsigned: true}}, Parent: &parent,
		TokenIDs: []int32{1, 2, 3}, BlockSize: 16, LoraID: -1}
	b := &wire.ObjectTag{Model: "llama", BlockHashes: []wire.BlockHash{{Int: 43, Unsigned: true}}, BlockSize: 16, LoraID: -1}
	ix := llmd.Index{}
	// The dial and the subscription race the first sends (a PUB drops what no peer has
	// subscribed to): store until one arrives.
	next := func() {
		t.Helper()
		f, err := sub.Next(200 * time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			if err := ix.Digest(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	for !ix.Has("llama", ^uint64(1), "dfkv-0") {
		if ctx.Err() != nil {
			t.Fatal("the indexer never saw the store")
		}
		p.Stored(a)
		next()
	}
	p.Stored(b)
	p.Removed(a)
	deadline := time.Now().Add(10 * time.Second)
	for !ix.Has("llama", 43, "dfkv-0") || ix.Has("llama", ^uint64(1), "dfkv-0") {
		if time.Now().After(deadline) {
			t.Fatalf("index %v: want 43 on dfkv-0 and 2^64-2 evicted", ix)
		}
		next()
	}
}
