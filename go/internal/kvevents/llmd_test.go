package kvevents

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// What llm-d's kv-cache indexer (its kvevents pool with the pebbe/zmq4 subscriber) expects,
// as its source reads: its SUB *binds* (tcp://*:5557) with the filter "kv@" and engines
// connect to it; a message is exactly [topic, 8-byte big-endian seq, payload]; the topic
// splits on "@" into kv, pod and model; the payload is an array of at least [ts, events]
// (a third element is the DP rank); every event is an array whose first element is its type
// name, BlockStored [type, hashes, parent or nil, []uint32 token ids, int block size, lora
// id or nil, medium] and BlockRemoved [type, hashes, medium], of exactly that length
// (vmihailenco/msgpack refuses an array-encoded struct of another length: the array
// layout ends at medium, as older vLLM's did, unless a LoRA name is set); older releases
// want uint64 hashes. It indexes (model, hash) -> pod. The types below decode as
// strictly: a map, bytes where a uint64 is wanted, or another length fails the test.
type llmdStored struct {
	_         struct{} `msgpack:",array"`
	Type      string
	Hashes    []uint64
	Parent    *uint64
	TokenIDs  []uint32
	BlockSize int
	LoraID    *int
	Medium    *string
}

type llmdRemoved struct {
	_      struct{} `msgpack:",array"`
	Type   string
	Hashes []uint64
	Medium *string
}

// llmdIndex is the indexer's view: (model, hash) -> pods holding it.
type llmdIndex map[string]map[uint64]map[string]bool

func (ix llmdIndex) digest(t *testing.T, f [][]byte) {
	t.Helper()
	if len(f) != 3 || len(f[1]) != 8 {
		t.Fatalf("message of %d frames", len(f))
	}
	parts := strings.Split(string(f[0]), "@")
	if len(parts) != 3 || parts[0] != "kv" {
		t.Fatalf("topic %q: not kv@<pod>@<model>", f[0])
	}
	pod, model := parts[1], parts[2]
	d := msgpack.NewDecoder(strings.NewReader(string(f[2])))
	n, err := d.DecodeArrayLen()
	if err != nil || n < 2 {
		t.Fatalf("batch: array of %d, %v", n, err)
	}
	if _, err := d.DecodeFloat64(); err != nil {
		t.Fatalf("batch ts: %v", err)
	}
	var events []msgpack.RawMessage
	if err := d.Decode(&events); err != nil {
		t.Fatalf("batch events: %v", err)
	}
	for _, raw := range events {
		var head []msgpack.RawMessage
		if err := msgpack.Unmarshal(raw, &head); err != nil || len(head) == 0 {
			t.Fatalf("event not an array_like tagged union: %v", err)
		}
		var kind string
		if err := msgpack.Unmarshal(head[0], &kind); err != nil {
			t.Fatalf("event type: %v", err)
		}
		switch kind {
		case "BlockStored":
			var ev llmdStored
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				t.Fatalf("BlockStored: %v", err)
			}
			for _, h := range ev.Hashes {
				if ix[model] == nil {
					ix[model] = map[uint64]map[string]bool{}
				}
				if ix[model][h] == nil {
					ix[model][h] = map[string]bool{}
				}
				ix[model][h][pod] = true
			}
		case "BlockRemoved":
			var ev llmdRemoved
			if err := msgpack.Unmarshal(raw, &ev); err != nil {
				t.Fatalf("BlockRemoved: %v", err)
			}
			for _, h := range ev.Hashes {
				delete(ix[model][h], pod)
			}
		case "AllBlocksCleared":
		default:
			t.Fatalf("unknown event type %q", kind)
		}
	}
}

// A publisher dials a subscriber that binds, as llm-d deploys its indexer, and the array
// layout with int hashes is what that indexer decodes: stores index the pod, removals
// unindex it.
func TestLLMDIndexerFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Endpoint: "tcp://127.0.0.1:0", Connect: []string{"tcp://" + sub.Addr().String()},
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
	ix := llmdIndex{}
	// The dial and the subscription race the first sends (a PUB drops what no peer has
	// subscribed to): store until one arrives.
	recv := make(chan [][]byte, 16)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				close(recv)
				return
			}
			recv <- msg.Frames
		}
	}()
	next := func() [][]byte {
		t.Helper()
		select {
		case f, ok := <-recv:
			if !ok {
				t.Fatal("subscriber closed")
			}
			return f
		case <-time.After(200 * time.Millisecond):
			return nil
		}
	}
	for ix["llama"][^uint64(1)]["dfkv-0"] == false {
		if ctx.Err() != nil {
			t.Fatal("the indexer never saw the store")
		}
		p.Stored(a)
		if f := next(); f != nil {
			ix.digest(t, f)
		}
	}
	p.Stored(b)
	p.Removed(a)
	deadline := time.Now().Add(10 * time.Second)
	for !(ix["llama"][43]["dfkv-0"] && !ix["llama"][^uint64(1)]["dfkv-0"]) {
		if time.Now().After(deadline) {
			t.Fatalf("index %v: want 43 on dfkv-0 and 2^64-2 evicted", ix)
		}
		if f := next(); f != nil {
			ix.digest(t, f)
		}
	}
}
