package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// BlockHash is one engine block hash: Bytes when non-nil, else Int (published as an
// unsigned 64-bit number when Unsigned, as vLLM's int hashes are).
type BlockHash struct {
	Bytes    []byte
	Int      int64
	Unsigned bool
}

// Tag is the engine identity of one stored value. A node with KV events on publishes
// BlockStored for it, and BlockRemoved when the value is evicted, removed or overwritten
// (docs/EVENTS.md).
type Tag struct {
	Key         []byte
	Model       string      // the model/namespace label routers subscribe to
	BlockHashes []BlockHash // the engine blocks the value holds (at least one)
	Parent      *BlockHash  // nil: the first block of a sequence
	TokenIDs    []int32
	BlockSize   uint32 // tokens per engine block
	LoraID      int64  // 0: none
	LoraName    string
}

// ErrTagsUnsupported: a node is older than Op Tag (it answered Invalid to a valid frame).
var ErrTagsUnsupported = errors.New("dfkv: node does not take tags (older than KV events)")

func (t *Tag) wire(c *Client) (wire.ObjectTag, error) {
	if len(t.BlockHashes) == 0 || len(t.BlockHashes) > wire.MaxTagHashes {
		return wire.ObjectTag{}, fmt.Errorf("dfkv: tag: %d block hashes (want 1..%d): %w", len(t.BlockHashes), wire.MaxTagHashes, ErrInvalid)
	}
	if len(t.TokenIDs) > wire.MaxTagTokens || len(t.Model) > wire.MaxTagLabel || len(t.LoraName) > wire.MaxTagLabel || t.LoraID < 0 {
		return wire.ObjectTag{}, fmt.Errorf("dfkv: tag: token ids, labels or lora id out of range: %w", ErrInvalid)
	}
	conv := func(h BlockHash) (wire.BlockHash, error) {
		if h.Bytes != nil && (len(h.Bytes) == 0 || len(h.Bytes) > wire.MaxTagHashBytes) {
			return wire.BlockHash{}, fmt.Errorf("dfkv: tag: %d-byte block hash (want 1..%d): %w", len(h.Bytes), wire.MaxTagHashBytes, ErrInvalid)
		}
		return wire.BlockHash{Bytes: h.Bytes, Int: h.Int, Unsigned: h.Unsigned}, nil
	}
	w := wire.ObjectTag{ID: c.ID(t.Key), Model: t.Model, TokenIDs: t.TokenIDs, BlockSize: t.BlockSize, LoraID: -1, LoraName: t.LoraName}
	if t.LoraID > 0 {
		w.LoraID = t.LoraID
	}
	w.BlockHashes = make([]wire.BlockHash, len(t.BlockHashes))
	for i, h := range t.BlockHashes {
		v, err := conv(h)
		if err != nil {
			return wire.ObjectTag{}, err
		}
		w.BlockHashes[i] = v
	}
	if t.Parent != nil {
		v, err := conv(*t.Parent)
		if err != nil {
			return wire.ObjectTag{}, err
		}
		w.Parent = &v
	}
	return w, nil
}

// maxTagChunk bounds one Tag frame's payload (well under wire.MaxTagPayload).
const maxTagChunk = 4 << 20

// Tag attaches engine identities to stored values, each on the node that owns its key,
// and returns how many were attached: a value that is not stored (never written, evicted
// since) is skipped, and a node without KV events attaches none. Send it after the PUTs
// of the same keys have returned.
func (c *Client) Tag(ctx context.Context, tags []Tag) (int, error) {
	if c.closed.Load() {
		return 0, ErrClosed
	}
	type group struct {
		p    *peer
		tags []wire.ObjectTag
	}
	groups := map[*peer]*group{}
	var order []*group
	for i := range tags {
		w, err := tags[i].wire(c)
		if err != nil {
			return 0, err
		}
		p, err := c.route(w.ID)
		if err != nil {
			return 0, err
		}
		g := groups[p]
		if g == nil {
			g = &group{p: p}
			groups[p] = g
			order = append(order, g)
		}
		g.tags = append(g.tags, w)
	}
	total := 0
	var errs []error
	for _, g := range order {
		for len(g.tags) > 0 {
			n, size := 0, 0
			for n < len(g.tags) && n < wire.MaxTagsPerRequest && (n == 0 || size < maxTagChunk) {
				size += 64 + 16*len(g.tags[n].BlockHashes) + 4*len(g.tags[n].TokenIDs)
				n++
			}
			payload := wire.EncodeTagBatch(g.tags[:n])
			g.tags = g.tags[n:]
			attached := 0
			err := c.exec(ctx, g.p, func(pc *pconn) error {
				req := wire.Request{Op: fb.OpTag, Tenant: c.tenant, PayloadLen: uint64(len(payload))}
				if err := pc.send(&req, payload); err != nil {
					return err
				}
				resp, err := pc.recv(fb.OpTag)
				if err != nil {
					return err
				}
				if resp.Status == fb.StatusInvalid {
					return statusError{fmt.Errorf("%s: %w", g.p.addr, ErrTagsUnsupported)}
				}
				attached = int(resp.Count)
				return statusReply(resp)
			})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			total += attached
		}
	}
	return total, errors.Join(errs...)
}
