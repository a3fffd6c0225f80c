package kvevents

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/dfkv/dfkv/go/internal/wire"
)

func sampleTag() *wire.ObjectTag {
	p := wire.BlockHash{Int: 5}
	return &wire.ObjectTag{Model: "m", BlockHashes: []wire.BlockHash{{Int: -9}, {Bytes: []byte{1, 2}}, {Int: -1, Unsigned: true}}, Parent: &p,
		TokenIDs: []int32{10, 11}, BlockSize: 16, LoraID: -1}
}

// The two layouts, decoded generically, are exactly vLLM's msgspec shapes.
func TestEncodeLayouts(t *testing.T) {
	evs := []Event{{Kind: Stored, Tag: sampleTag()}, {Kind: Removed, Tag: sampleTag()}, {Kind: Cleared}}
	for _, tc := range []struct {
		layout Layout
		want   any
	}{
		{LayoutArray, []any{1.5, []any{
			[]any{"BlockStored", []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, int8(5), []any{int8(10), int8(11)}, int8(16), nil, "CPU"},
			[]any{"BlockRemoved", []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, "CPU"},
			[]any{"AllBlocksCleared"},
		}, int8(2)}},
		{LayoutMap, []any{1.5, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, "parent_block_hash": int8(5),
				"token_ids": []any{int8(10), int8(11)}, "block_size": int8(16), "lora_id": nil, "medium": "CPU", "lora_name": nil},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, "medium": "CPU"},
			map[string]any{"type": "AllBlocksCleared"},
		}, int8(2)}},
		{LayoutMapAll, map[string]any{"ts": 1.5, "data_parallel_rank": int8(2), "events": []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, "parent_block_hash": int8(5),
				"token_ids": []any{int8(10), int8(11)}, "block_size": int8(16), "lora_id": nil, "medium": "CPU", "lora_name": nil},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int8(-9), []byte{1, 2}, uint64(1<<64 - 1)}, "medium": "CPU"},
			map[string]any{"type": "AllBlocksCleared"},
		}}},
	} {
		t.Run(tc.layout.String(), func(t *testing.T) {
			b, err := newEncoder(tc.layout, "CPU", 2).batch(1.5, evs)
			if err != nil {
				t.Fatal(err)
			}
			var got any
			if err := msgpack.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

// A lora_name is written when set (it is the one field with a default, left out when nil).
func TestEncodeLoraName(t *testing.T) {
	tag := sampleTag()
	tag.LoraName = "adapter"
	b, err := newEncoder(LayoutArray, "CPU", 0).batch(1, []Event{{Kind: Stored, Tag: tag}})
	if err != nil {
		t.Fatal(err)
	}
	var got []any
	if err := msgpack.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	ev := got[1].([]any)[0].([]any)
	if len(ev) != 8 || ev[7] != "adapter" {
		t.Fatalf("BlockStored with a lora_name: %v", ev)
	}
}

func TestParseLayout(t *testing.T) {
	for in, want := range map[string]Layout{"array": LayoutArray, "map": LayoutMap, "map-all": LayoutMapAll} {
		if l, err := ParseLayout(in); err != nil || l != want {
			t.Fatalf("%s: %v %v", in, l, err)
		}
	}
	if _, err := ParseLayout("json"); err == nil {
		t.Fatal("json accepted")
	}
}
