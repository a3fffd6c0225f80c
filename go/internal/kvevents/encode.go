package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// Layout is the msgpack shape of events; vLLM has shipped both, and consumers pinned to
// one break on the other.
type Layout uint8

const (
	// LayoutArray: every struct array_like (older vLLM): a batch is
	// [ts, events, data_parallel_rank] and an event ["BlockStored", field, ...].
	LayoutArray Layout = iota
	// LayoutMap: events as msgspec tagged maps in an array_like batch (vLLM 0.33):
	// [ts, [{"type": "BlockStored", field: value, ...}, ...], data_parallel_rank].
	LayoutMap
	// LayoutMapAll: the batch a map too ({"ts", "events", "data_parallel_rank"}), as in
	// vLLM builds whose EventBatch is not array_like.
	LayoutMapAll
)

// ParseLayout maps the --kv-events-layout flag onto a Layout.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "array":
		return LayoutArray, nil
	case "map":
		return LayoutMap, nil
	case "map-all":
		return LayoutMapAll, nil
	}
	return 0, fmt.Errorf("kvevents: layout %q: want array, map or map-all", s)
}

func (l Layout) String() string {
	switch l {
	case LayoutMap:
		return "map"
	case LayoutMapAll:
		return "map-all"
	}
	return "array"
}

func (l Layout) batchMap() bool { return l == LayoutMapAll }
func (l Layout) eventMap() bool { return l != LayoutArray }

// Kind is an event type.
type Kind uint8

const (
	Stored  Kind = iota + 1 // BlockStored
	Removed                 // BlockRemoved
	Cleared                 // AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case Stored:
		return "BlockStored"
	case Removed:
		return "BlockRemoved"
	case Cleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one KV event. Tag is unused for Cleared.
type Event struct {
	Kind Kind
	Tag  *wire.ObjectTag
}

// encoder writes event batches; not safe for concurrent use.
type encoder struct {
	buf    bytes.Buffer
	enc    *msgpack.Encoder
	layout Layout
	medium string
	rank   int
}

func newEncoder(layout Layout, medium string, rank int) *encoder {
	e := &encoder{layout: layout, medium: medium, rank: rank}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// batch encodes [ts, events, data_parallel_rank] (or its map form) and returns a copy.
func (e *encoder) batch(ts float64, events []Event) ([]byte, error) {
	e.buf.Reset()
	if err := e.encodeBatch(ts, events); err != nil {
		return nil, fmt.Errorf("kvevents: encode: %w", err)
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (e *encoder) encodeBatch(ts float64, events []Event) error {
	m := e.enc
	if e.layout.batchMap() {
		if err := m.EncodeMapLen(3); err != nil {
			return err
		}
		if err := m.EncodeString("ts"); err != nil {
			return err
		}
	} else if err := m.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := m.EncodeFloat64(ts); err != nil {
		return err
	}
	if e.layout.batchMap() {
		if err := m.EncodeString("events"); err != nil {
			return err
		}
	}
	if err := m.EncodeArrayLen(len(events)); err != nil {
		return err
	}
	for i := range events {
		if err := e.event(&events[i]); err != nil {
			return err
		}
	}
	if e.layout.batchMap() {
		if err := m.EncodeString("data_parallel_rank"); err != nil {
			return err
		}
	}
	return m.EncodeInt(int64(e.rank))
}

// field is one struct field: its name (map layout) and how to write its value.
type field struct {
	name  string
	write func() error
}

func (e *encoder) event(ev *Event) error {
	m := e.enc
	var fields []field
	switch ev.Kind {
	case Stored:
		t := ev.Tag
		fields = []field{
			{"block_hashes", func() error { return e.hashes(t.BlockHashes) }},
			{"parent_block_hash", func() error {
				if t.Parent == nil {
					return m.EncodeNil()
				}
				return e.hash(*t.Parent)
			}},
			{"token_ids", func() error {
				if err := m.EncodeArrayLen(len(t.TokenIDs)); err != nil {
					return err
				}
				for _, id := range t.TokenIDs {
					if err := m.EncodeInt(int64(id)); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func() error { return m.EncodeUint(uint64(t.BlockSize)) }},
			{"lora_id", func() error {
				if t.LoraID < 0 {
					return m.EncodeNil()
				}
				return m.EncodeInt(t.LoraID)
			}},
			{"medium", e.mediumField},
			{"lora_name", func() error {
				if t.LoraName == "" {
					return m.EncodeNil()
				}
				return m.EncodeString(t.LoraName)
			}},
		}
	case Removed:
		t := ev.Tag
		fields = []field{
			{"block_hashes", func() error { return e.hashes(t.BlockHashes) }},
			{"medium", e.mediumField},
		}
	case Cleared:
	default:
		return fmt.Errorf("event kind %d", ev.Kind)
	}
	// The array layout is older vLLM's BlockStored, which ended at medium: without a LoRA
	// name it stops there too, since llm-d's indexer decodes arrays of exactly that length
	// and drops longer ones. (vLLM 0.33's tagged map requires lora_name: always written.)
	if ev.Kind == Stored && ev.Tag.LoraName == "" && !e.layout.eventMap() {
		fields = fields[:len(fields)-1]
	}
	// msgspec's tag: the class name, first in an array, under "type" in a map.
	if e.layout.eventMap() {
		if err := m.EncodeMapLen(len(fields) + 1); err != nil {
			return err
		}
		if err := m.EncodeString("type"); err != nil {
			return err
		}
	} else if err := m.EncodeArrayLen(len(fields) + 1); err != nil {
		return err
	}
	if err := m.EncodeString(ev.Kind.String()); err != nil {
		return err
	}
	for _, f := range fields {
		if e.layout.eventMap() {
			if err := m.EncodeString(f.name); err != nil {
				return err
			}
		}
		if err := f.write(); err != nil {
			return err
		}
	}
	return nil
}

func (e *encoder) mediumField() error {
	if e.medium == "" {
		return e.enc.EncodeNil()
	}
	return e.enc.EncodeString(e.medium)
}

func (e *encoder) hashes(hs []wire.BlockHash) error {
	if err := e.enc.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := e.hash(h); err != nil {
			return err
		}
	}
	return nil
}

func (e *encoder) hash(h wire.BlockHash) error {
	if h.Bytes != nil {
		return e.enc.EncodeBytes(h.Bytes)
	}
	if h.Unsigned {
		return e.enc.EncodeUint(uint64(h.Int))
	}
	return e.enc.EncodeInt(h.Int)
}
