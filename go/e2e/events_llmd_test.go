package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/testutil/llmd"
)

// TestLLMDIndexerFedByServer: a real dfkv_server dials an indexer's bound SUB (as llm-d
// deploys it) and publishes the array layout with uint64 hashes; the indexer, decoding as
// strictly as llm-d's pool, lists the blocks a client stored and tagged, and after a small
// --cap forces evictions it lists exactly the blocks the node still holds.
func TestLLMDIndexerFedByServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sub, err := llmd.Listen(ctx, "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	const capBytes, size = 16 << 20, 256 << 10
	s := startServer(t, t.TempDir(), "--cap", fmt.Sprint(capBytes), "--max-msg", "1MiB",
		"--kv-events", "tcp://127.0.0.1:0", "--kv-events-connect", sub.Endpoint(),
		"--kv-events-layout", "array", "--kv-events-node", "pod-a")
	c := newClient(t, s.addr)
	ix := llmd.Index{}
	drain := func(wait time.Duration) {
		t.Helper()
		for {
			f, err := sub.Next(wait)
			if err != nil {
				t.Fatal(err)
			}
			if f == nil {
				return
			}
			if err := ix.Digest(f); err != nil {
				t.Fatalf("llm-d would refuse the message: %v", err)
			}
		}
	}
	store := func(key string, hash uint64) {
		t.Helper()
		if err := c.Put(ctx, []byte(key), value(key, 1, size)); err != nil {
			t.Fatal(err)
		}
		tag := client.Tag{Key: []byte(key), Model: "m1", BlockHashes: []client.BlockHash{{Int: int64(hash), Unsigned: true}}, BlockSize: 16}
		if n, err := c.Tag(ctx, []client.Tag{tag}); err != nil || n != 1 {
			t.Fatalf("tag %s: %d, %v", key, n, err)
		}
	}
	// The dial and the subscription race the first batches (a PUB drops what no subscriber
	// has asked for yet): store probe blocks until one is indexed.
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			t.Fatal("the indexer never saw a store")
		}
		store(fmt.Sprintf("probe-%d", i), 1<<63+uint64(i))
		drain(200 * time.Millisecond)
		if ix.Has("m1", 1<<63+uint64(i), "pod-a") {
			break
		}
	}

	// Four times the cap of tagged blocks: the early ones are evicted.
	const n = 4 * capBytes / size
	hash := func(i int) uint64 { return ^uint64(0) - uint64(i) } // uint64 above 2^63, as vLLM's int hashes
	for i := range n {
		store(fmt.Sprintf("block-%d", i), hash(i))
		drain(0)
	}
	held := func(i int) bool {
		_, err := c.Exist(ctx, []byte(fmt.Sprintf("block-%d", i)))
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		drain(300 * time.Millisecond)
		var wrong []int
		kept := 0
		for i := range n {
			h := held(i)
			if h {
				kept++
			}
			if h != ix.Has("m1", hash(i), "pod-a") {
				wrong = append(wrong, i)
			}
		}
		if len(wrong) == 0 {
			if kept == 0 || kept == n {
				t.Fatalf("%d of %d blocks held: the cap did not force evictions", kept, n)
			}
			t.Logf("%d of %d blocks held and indexed, the %d evicted unindexed", kept, n, n-kept)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("index disagrees with the node on blocks %v (of %d)", wrong, n)
		}
	}
}
