package wire

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func sampleTags() []ObjectTag {
	parent := BlockHash{Int: -42}
	return []ObjectTag{
		{ID: identity.ObjectID{Hi: 1, Lo: 2}, Model: "meta-llama/Llama-3.1-8B", BlockHashes: []BlockHash{{Int: 7}, {Int: -1 << 63}, {Int: -1, Unsigned: true}},
			Parent: &parent, TokenIDs: []int32{1, 2, 3, -4}, BlockSize: 16, LoraID: 3, LoraName: "adapter"},
		{ID: identity.ObjectID{Hi: 3, Lo: 4}, BlockHashes: []BlockHash{{Bytes: []byte("0123456789abcdef0123456789abcdef")}}, BlockSize: 256, LoraID: -1},
	}
}

func TestTagBatchRoundTrip(t *testing.T) {
	in := sampleTags()
	out, err := DecodeTagBatch(EncodeTagBatch(in))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(in, out); d != "" {
		t.Fatalf("round trip (-in +out):\n%s", d)
	}
	one, err := DecodeTag(EncodeTag(&in[0]))
	if err != nil || cmp.Diff(in[0], one) != "" {
		t.Fatalf("single tag: %v %s", err, cmp.Diff(in[0], one))
	}
}

func TestTagBatchRefusals(t *testing.T) {
	long := make([]byte, MaxTagHashBytes+1)
	for _, tc := range []struct {
		name string
		tags []ObjectTag
		want error
	}{
		{"no tags", nil, ErrMalformed},
		{"no block hash", []ObjectTag{{ID: identity.ObjectID{Hi: 1}}}, ErrMalformed},
		{"hash too long", []ObjectTag{{BlockHashes: []BlockHash{{Bytes: long}}}}, ErrLimit},
		{"label too long", []ObjectTag{{Model: string(make([]byte, MaxTagLabel+1)), BlockHashes: []BlockHash{{Int: 1}}}}, ErrLimit},
		{"bad utf-8", []ObjectTag{{Model: "\xff", BlockHashes: []BlockHash{{Int: 1}}}}, ErrMalformed},
		{"lora id", []ObjectTag{{LoraID: -2, BlockHashes: []BlockHash{{Int: 1}}}}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTagBatch(EncodeTagBatch(tc.tags))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := DecodeTagBatch([]byte{1, 2, 3}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short buffer: %v", err)
	}
}

func TestTagLimits(t *testing.T) {
	l := DefaultLimits()
	for _, tc := range []struct {
		n  uint64
		ok bool
	}{{0, false}, {1, true}, {MaxTagPayload, true}, {MaxTagPayload + 1, false}} {
		err := l.Check(&Request{Op: fb.OpTag, PayloadLen: tc.n})
		if (err == nil) != tc.ok {
			t.Fatalf("payload %d: %v", tc.n, err)
		}
	}
}

func FuzzDecodeTagBatch(f *testing.F) {
	f.Add(EncodeTagBatch(sampleTags()))
	f.Add(EncodeTag(&sampleTags()[0]))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		tags, err := DecodeTagBatch(data)
		if err == nil {
			// Whatever decodes re-encodes to the same tags.
			again, err := DecodeTagBatch(EncodeTagBatch(tags))
			if err != nil || cmp.Diff(tags, again) != "" {
				t.Fatalf("re-encode: %v %s", err, cmp.Diff(tags, again))
			}
		}
		if tag, err := DecodeTag(data); err == nil {
			if _, err := DecodeTag(EncodeTag(&tag)); err != nil {
				t.Fatalf("re-encode single: %v", err)
			}
		}
	})
}
