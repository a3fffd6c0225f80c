package wire

import (
	"fmt"
	"unicode/utf8"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Bounds of one Tag frame (Op Tag, schema/tag.fbs). A tag names the engine blocks of one
// object: a handful of hashes and at most a few thousand token ids.
const (
	MaxTagPayload     = 16 << 20 // bytes of one TagBatch
	MaxTagHashes      = 1024     // block hashes of one object
	MaxTagHashBytes   = 64       // a bytes block hash (vLLM's are 32)
	MaxTagTokens      = 1 << 16  // token ids of one object
	MaxTagLabel       = 256      // model and LoRA names
	MaxTagsPerRequest = 4096
)

// BlockHash is one engine block hash: Bytes when non-nil, else Int (as uint64 when
// Unsigned: vLLM's int hashes are unsigned 64-bit, older ones signed).
type BlockHash struct {
	Bytes    []byte
	Int      int64
	Unsigned bool
}

// ObjectTag is the engine identity of one stored object.
type ObjectTag struct {
	ID          identity.ObjectID
	Model       string
	BlockHashes []BlockHash
	Parent      *BlockHash // nil: the first block of a sequence
	TokenIDs    []int32
	BlockSize   uint32
	LoraID      int64 // -1: none
	LoraName    string
}

func createHash(b *flatbuffers.Builder, h BlockHash) flatbuffers.UOffsetT {
	var bv flatbuffers.UOffsetT
	if h.Bytes != nil {
		bv = b.CreateByteVector(h.Bytes)
	}
	fb.BlockHashStart(b)
	if h.Bytes != nil {
		fb.BlockHashAddBytesValue(b, bv)
	} else {
		fb.BlockHashAddIntValue(b, h.Int)
		if h.Unsigned {
			fb.BlockHashAddUnsigned(b, true)
		}
	}
	return fb.BlockHashEnd(b)
}

// EncodeTagBatch builds the TagBatch payload of Op Tag.
func EncodeTagBatch(tags []ObjectTag) []byte {
	b := flatbuffers.NewBuilder(256 * (len(tags) + 1))
	offs := make([]flatbuffers.UOffsetT, len(tags))
	for i := range tags {
		offs[i] = encodeTag(b, &tags[i])
	}
	fb.TagBatchStartTagsVector(b, len(offs))
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	vec := b.EndVector(len(offs))
	fb.TagBatchStart(b)
	fb.TagBatchAddTags(b, vec)
	b.Finish(fb.TagBatchEnd(b))
	return b.FinishedBytes()
}

// EncodeTag builds one ObjectTag as a root table (the tag log stores tags this way).
func EncodeTag(t *ObjectTag) []byte {
	b := flatbuffers.NewBuilder(256)
	b.Finish(encodeTag(b, t))
	return b.FinishedBytes()
}

func encodeTag(b *flatbuffers.Builder, t *ObjectTag) flatbuffers.UOffsetT {
	hs := make([]flatbuffers.UOffsetT, len(t.BlockHashes))
	for i, h := range t.BlockHashes {
		hs[i] = createHash(b, h)
	}
	fb.ObjectTagStartBlockHashesVector(b, len(hs))
	for i := len(hs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(hs[i])
	}
	hv := b.EndVector(len(hs))
	var parent, toks, model, lora flatbuffers.UOffsetT
	if t.Parent != nil {
		parent = createHash(b, *t.Parent)
	}
	if len(t.TokenIDs) > 0 {
		fb.ObjectTagStartTokenIdsVector(b, len(t.TokenIDs))
		for i := len(t.TokenIDs) - 1; i >= 0; i-- {
			b.PrependInt32(t.TokenIDs[i])
		}
		toks = b.EndVector(len(t.TokenIDs))
	}
	if t.Model != "" {
		model = b.CreateString(t.Model)
	}
	if t.LoraName != "" {
		lora = b.CreateString(t.LoraName)
	}
	fb.ObjectTagStart(b)
	fb.ObjectTagAddIdHi(b, t.ID.Hi)
	fb.ObjectTagAddIdLo(b, t.ID.Lo)
	fb.ObjectTagAddBlockHashes(b, hv)
	if parent != 0 {
		fb.ObjectTagAddParentBlockHash(b, parent)
	}
	if toks != 0 {
		fb.ObjectTagAddTokenIds(b, toks)
	}
	if model != 0 {
		fb.ObjectTagAddModel(b, model)
	}
	if lora != 0 {
		fb.ObjectTagAddLoraName(b, lora)
	}
	fb.ObjectTagAddBlockSize(b, t.BlockSize)
	fb.ObjectTagAddLoraId(b, t.LoraID)
	return fb.ObjectTagEnd(b)
}

// DecodeTagBatch parses and validates the payload of Op Tag. Malformed input is an error
// wrapping ErrMalformed or ErrLimit, never a panic.
func DecodeTagBatch(buf []byte) ([]ObjectTag, error) {
	if len(buf) > MaxTagPayload {
		return nil, fmt.Errorf("wire: tag batch: %w: %d bytes > %d", ErrLimit, len(buf), MaxTagPayload)
	}
	var out []ObjectTag
	err := DecodeTable(buf, func(buf []byte) error {
		t := fb.GetRootAsTagBatch(buf, 0)
		n := t.TagsLength()
		if n == 0 {
			return fmt.Errorf("%w: no tags", ErrMalformed)
		}
		if n > MaxTagsPerRequest || n > len(buf)/4 {
			return fmt.Errorf("%w: %d tags", ErrLimit, n)
		}
		out = make([]ObjectTag, 0, n)
		var ot fb.ObjectTag
		for i := 0; i < n; i++ {
			if !t.Tags(&ot, i) {
				return fmt.Errorf("%w: tag %d missing", ErrMalformed, i)
			}
			tag, err := decodeTag(&ot, len(buf))
			if err != nil {
				return fmt.Errorf("tag %d: %w", i, err)
			}
			out = append(out, tag)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wire: tag batch: %w", err)
	}
	return out, nil
}

// DecodeTag parses one root ObjectTag (EncodeTag's output).
func DecodeTag(buf []byte) (ObjectTag, error) {
	var tag ObjectTag
	err := DecodeTable(buf, func(buf []byte) error {
		var err error
		tag, err = decodeTag(fb.GetRootAsObjectTag(buf, 0), len(buf))
		return err
	})
	if err != nil {
		return ObjectTag{}, fmt.Errorf("wire: tag: %w", err)
	}
	return tag, nil
}

func decodeHash(h *fb.BlockHash) (BlockHash, error) {
	if n := h.BytesValueLength(); n > 0 {
		if n > MaxTagHashBytes {
			return BlockHash{}, fmt.Errorf("%w: %d-byte block hash > %d", ErrLimit, n, MaxTagHashBytes)
		}
		return BlockHash{Bytes: append([]byte(nil), h.BytesValueBytes()...)}, nil
	}
	return BlockHash{Int: h.IntValue(), Unsigned: h.Unsigned()}, nil
}

func decodeTag(t *fb.ObjectTag, bufLen int) (ObjectTag, error) {
	tag := ObjectTag{
		ID:        identity.ObjectID{Hi: t.IdHi(), Lo: t.IdLo()},
		Model:     string(t.Model()),
		BlockSize: t.BlockSize(),
		LoraID:    t.LoraId(),
		LoraName:  string(t.LoraName()),
	}
	if len(tag.Model) > MaxTagLabel || len(tag.LoraName) > MaxTagLabel {
		return ObjectTag{}, fmt.Errorf("%w: label longer than %d bytes", ErrLimit, MaxTagLabel)
	}
	if !utf8.ValidString(tag.Model) || !utf8.ValidString(tag.LoraName) {
		return ObjectTag{}, fmt.Errorf("%w: label is not UTF-8", ErrMalformed)
	}
	if tag.LoraID < -1 {
		return ObjectTag{}, fmt.Errorf("%w: lora id %d", ErrMalformed, tag.LoraID)
	}
	n := t.BlockHashesLength()
	if n == 0 {
		return ObjectTag{}, fmt.Errorf("%w: no block hash", ErrMalformed)
	}
	if n > MaxTagHashes || n > bufLen/4 {
		return ObjectTag{}, fmt.Errorf("%w: %d block hashes", ErrLimit, n)
	}
	tag.BlockHashes = make([]BlockHash, n)
	var h fb.BlockHash
	for i := 0; i < n; i++ {
		if !t.BlockHashes(&h, i) {
			return ObjectTag{}, fmt.Errorf("%w: block hash %d missing", ErrMalformed, i)
		}
		v, err := decodeHash(&h)
		if err != nil {
			return ObjectTag{}, err
		}
		tag.BlockHashes[i] = v
	}
	if p := t.ParentBlockHash(nil); p != nil {
		v, err := decodeHash(p)
		if err != nil {
			return ObjectTag{}, err
		}
		tag.Parent = &v
	}
	nt := t.TokenIdsLength()
	if nt > MaxTagTokens || nt > bufLen/4 {
		return ObjectTag{}, fmt.Errorf("%w: %d token ids", ErrLimit, nt)
	}
	if nt > 0 {
		tag.TokenIDs = make([]int32, nt)
		for i := range tag.TokenIDs {
			tag.TokenIDs[i] = t.TokenIds(i)
		}
	}
	return tag, nil
}
