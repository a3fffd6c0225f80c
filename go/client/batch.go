package client

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Item is one key of a batch call. Inputs: Key, and Value or Segs (put) / Buf or Segs (get).
// Outputs: Err (nil on success/hit) and N (value length for gets and exists).
// Every item starts as failed (ErrUnavailable) and is set only once its outcome is known.
type Item struct {
	Key   []byte
	Value []byte
	Buf   []byte
	Segs  [][]byte
	N     int64
	Err   error
	// Leased (BatchExistLease): the hit is protected from eviction until it is read or
	// the lease ends. A hit past the server's lease budget has Err nil and Leased false.
	Leased bool

	id      identity.ObjectID
	replica bool // BatchGet: sent to a hot key's replica (a failure there falls back)
	direct  bool // BatchGet into device memory (direct.go): RDMA to the primary only
}

func (it *Item) segs(forGet bool) [][]byte {
	if it.Segs != nil {
		return it.Segs
	}
	if forGet {
		return [][]byte{it.Buf}
	}
	return [][]byte{it.Value}
}

func segsLen(segs [][]byte) uint64 {
	n := uint64(0)
	for _, s := range segs {
		n += uint64(len(s))
	}
	return n
}

// GetMode selects the size contract of BatchGet.
type GetMode int

const (
	// Exact: the stored value must be exactly the buffer's length.
	Exact GetMode = iota
	// Auto: the stored value must fit the buffer; Item.N receives its length.
	Auto
)

// BatchPut stores every item (Value, or Segs gathered in order).
func (c *Client) BatchPut(ctx context.Context, items []Item) error {
	return c.batch(ctx, fb.OpBatchPut, items, 0, opBatchPut)
}

// BatchGet reads every item into Buf (or scatters into Segs).
func (c *Client) BatchGet(ctx context.Context, items []Item, mode GetMode) error {
	flags := wire.FlagExact
	if mode == Auto {
		flags = wire.FlagCap
	}
	return c.batch(ctx, fb.OpBatchGet, items, flags, opBatchGet)
}

// BatchExist sets N to each item's stored length (Err = ErrNotFound when absent).
func (c *Client) BatchExist(ctx context.Context, items []Item) error {
	return c.batch(ctx, fb.OpBatchExist, items, 0, opBatchExist)
}

// BatchExistLease is BatchExist that also leases every hit on its server for lease (0 =
// the server's default, 10 s; at most 60 s): the value is protected from capacity eviction
// until it is read or the lease expires, so that a lookup's answer still holds when the
// read it announces arrives. Leases are bounded on the server; past the bound a hit comes
// back without one (Leased false).
func (c *Client) BatchExistLease(ctx context.Context, items []Item, lease time.Duration) error {
	if lease < 0 {
		return fmt.Errorf("dfkv: lease %v: %w", lease, ErrInvalid)
	}
	return c.batchArg(ctx, fb.OpBatchExistLease, items, 0, opBatchExist, uint64(lease/time.Millisecond))
}

// BatchRemove removes every item.
func (c *Client) BatchRemove(ctx context.Context, items []Item) error {
	return c.batch(ctx, fb.OpBatchRemove, items, 0, opBatchRemove)
}

type chunk struct {
	p     *peer
	items []*Item
}

// maxChunkBytes bounds one batch frame's value bytes so a chunk's replies stream out
// without one connection carrying an unbounded frame.
const maxChunkBytes = 64 << 20

func (c *Client) batch(ctx context.Context, op fb.Op, items []Item, flags uint8, kind opKind) error {
	return c.batchArg(ctx, op, items, flags, kind, 0)
}

// batchArg runs a batch whose request header carries arg in its length field (the lease
// of BatchExistLease). The call's error is for the call as a whole (closed client, context
// already ended); each item's outcome is in its Err.
func (c *Client) batchArg(ctx context.Context, op fb.Op, items []Item, flags uint8, kind opKind, arg uint64) error {
	start := time.Now()
	if c.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		err = ctxErr("batch", err)
		for i := range items {
			items[i].Err, items[i].N, items[i].Leased = err, 0, false
		}
		return err
	}
	all := make([]*Item, 0, len(items))
	for i := range items {
		it := &items[i]
		it.Err, it.N, it.Leased, it.replica, it.direct = ErrUnavailable, 0, false, false, false
		if err := c.checkItem(op, it); err != nil {
			it.Err = err
			continue
		}
		it.id = c.ID(it.Key)
		all = append(all, it)
	}
	c.runItems(ctx, op, flags, arg, all, op == fb.OpBatchGet)
	if op == fb.OpBatchGet {
		// A hot key's replica that missed or failed: the primary answers (never a replica's miss).
		var again []*Item
		for _, it := range all {
			if it.replica {
				if it.Err == nil {
					c.m.hotReads.WithLabelValues("hit").Inc()
				} else {
					c.m.hotReads.WithLabelValues("fallback").Inc()
					it.Err, it.N, it.replica = ErrUnavailable, 0, false
					again = append(again, it)
				}
			}
		}
		if len(again) > 0 {
			c.runItems(ctx, op, flags, arg, again, false)
		}
	}
	var moved int64
	for i := range items {
		it := &items[i]
		c.m.ops[kind][result(it.Err)].Inc()
		if it.direct {
			c.m.directDone(it.Err)
		}
		if it.Err == nil && (op == fb.OpBatchGet || op == fb.OpBatchPut) {
			moved += it.N
		}
	}
	c.m.bytes[kind].Add(float64(moved))
	c.m.latency[kind].Observe(time.Since(start).Seconds())
	return nil
}

// runItems groups items by the peer serving them (a hot key's replica when spread is set)
// and runs the chunks, the first on the calling goroutine.
func (c *Client) runItems(ctx context.Context, op fb.Op, flags uint8, arg uint64, items []*Item, spread bool) {
	view := c.opts.Membership.View()
	groups := map[*peer][]*Item{}
	var order []*peer
	for _, it := range items {
		var p *peer
		if spread && !it.direct {
			if p = c.replicaPeer(it.id); p != nil {
				it.replica = true
			}
		}
		if p == nil {
			m, ok := view.Owner(it.id.Hi)
			if !ok {
				continue
			}
			p = c.peerFor(m)
			if p.cooling() {
				c.m.fastFails.Inc()
				continue
			}
		}
		if _, seen := groups[p]; !seen {
			order = append(order, p)
		}
		groups[p] = append(groups[p], it)
	}
	var chunks []chunk
	for _, p := range order {
		chunks = appendChunks(chunks, p, groups[p], op, c.opts)
	}
	var wg sync.WaitGroup
	for i := 1; i < len(chunks); i++ {
		select {
		case c.fanout <- struct{}{}:
		case <-ctx.Done(): // never ready for a context that cannot end
			c.runChunk(ctx, op, flags, arg, chunks[i]) // fails at once: items get the context's error
			continue
		}
		wg.Add(1)
		go func(ch chunk) {
			defer func() { <-c.fanout; wg.Done() }()
			c.runChunk(ctx, op, flags, arg, ch)
		}(chunks[i])
	}
	if len(chunks) > 0 {
		c.runChunk(ctx, op, flags, arg, chunks[0])
	}
	wg.Wait()
}

func (c *Client) checkItem(op fb.Op, it *Item) error {
	switch op {
	case fb.OpBatchPut, fb.OpBatchGet:
		segs := it.segs(op == fb.OpBatchGet)
		if len(segs) == 0 || len(segs) > int(c.opts.Limits.MaxSgSegs) {
			return fmt.Errorf("dfkv: %d segments (max %d): %w", len(segs), c.opts.Limits.MaxSgSegs, ErrInvalid)
		}
		n := segsLen(segs)
		if n == 0 {
			return fmt.Errorf("dfkv: empty value/buffer: %w", ErrInvalid)
		}
		if n > c.opts.Limits.MaxValue {
			return fmt.Errorf("dfkv: value/buffer of %d bytes exceeds max value %d: %w: %w", n, c.opts.Limits.MaxValue, ErrTooLarge, ErrInvalid)
		}
		if op == fb.OpBatchPut {
			return c.noDeviceSource(segs)
		}
		d, err := c.rdma.Direct(segs)
		if err != nil {
			return err
		}
		it.direct = d
	}
	return nil
}

// appendChunks splits one peer's items into at most BatchConcurrency frames (more when the
// item or byte limits demand), so a large batch to one node uses several connections.
func appendChunks(out []chunk, p *peer, items []*Item, op fb.Op, o Options) []chunk {
	per := (len(items) + o.BatchConcurrency - 1) / o.BatchConcurrency
	per = max(1, min(per, int(o.Limits.MaxBatchItems)))
	for len(items) > 0 {
		n, bytes := 0, uint64(0)
		for n < len(items) && n < per {
			if op == fb.OpBatchPut || op == fb.OpBatchGet {
				b := segsLen(items[n].segs(op == fb.OpBatchGet))
				if n > 0 && bytes+b > maxChunkBytes {
					break
				}
				bytes += b
			}
			n++
		}
		out = append(out, chunk{p: p, items: items[:n]})
		items = items[n:]
	}
	return out
}

func (c *Client) runChunk(ctx context.Context, op fb.Op, flags uint8, arg uint64, ch chunk) {
	if c.opts.RDMA != nil {
		if ch.items = c.rdmaChunk(ctx, op, flags, ch); len(ch.items) == 0 {
			return
		}
	}
	status := make([]error, len(ch.items))
	lens := make([]int64, len(ch.items))
	leased := make([]bool, len(ch.items))
	err := c.exec(ctx, ch.p, func(pc *pconn) error {
		return c.chunkOnce(pc, op, flags, arg, ch.items, status, lens, leased)
	})
	for i, it := range ch.items {
		if err != nil {
			it.Err = err
			continue
		}
		it.Err, it.N, it.Leased = status[i], lens[i], leased[i]
	}
}

// chunkOnce sends one batch frame and reads its per-item replies.
func (c *Client) chunkOnce(pc *pconn, op fb.Op, flags uint8, arg uint64, items []*Item, status []error, lens []int64, leased []bool) error {
	need := len(items) * wire.BatchItemSize
	if cap(pc.scratch) < need {
		pc.scratch = make([]byte, need)
	}
	scratch := pc.scratch[:need]
	req := wire.Request{Op: op, Count: uint32(len(items)), Tenant: c.tenant, Length: arg}
	var payload [][]byte
	for i, it := range items {
		bi := wire.BatchItem{ID: it.id}
		switch op {
		case fb.OpBatchPut:
			bi.Length = segsLen(it.segs(false))
		case fb.OpBatchGet:
			bi.Length, bi.Flags = segsLen(it.segs(true)), flags
			if it.replica {
				bi.Flags |= wire.FlagReplica
			}
		}
		b := scratch[i*wire.BatchItemSize : (i+1)*wire.BatchItemSize]
		bi.Encode(b)
		if op == fb.OpBatchPut {
			payload = append(payload, b)
			payload = append(payload, it.segs(false)...)
			req.PayloadLen += wire.BatchItemSize + bi.Length
		}
	}
	if op != fb.OpBatchPut {
		payload = [][]byte{scratch}
		req.PayloadLen = uint64(need)
	}
	if err := pc.send(&req, payload...); err != nil {
		return err
	}
	resp, err := pc.recv(op)
	if err != nil {
		return err
	}
	if resp.Status != fb.StatusOk {
		if resp.Count == 0 {
			return statusError{statusErr(resp.Status)}
		}
		return fmt.Errorf("%w: batch status %d with %d items", ErrProtocol, resp.Status, resp.Count)
	}
	if int(resp.Count) != len(items) {
		return fmt.Errorf("%w: batch reply has %d items, sent %d", ErrProtocol, resp.Count, len(items))
	}
	var rb [wire.BatchResultSize]byte
	for i, it := range items {
		if _, err := io.ReadFull(pc.br, rb[:]); err != nil {
			return err
		}
		r, err := wire.DecodeBatchResult(rb[:])
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		status[i] = statusErr(r.Status)
		if r.Status == fb.StatusInvalid && r.ValueLen != 0 && op == fb.OpBatchGet {
			status[i] = fmt.Errorf("dfkv: stored %d bytes: %w", r.ValueLen, ErrBufferTooSmall)
		}
		switch op {
		case fb.OpBatchGet:
			if r.Status == fb.StatusOk && (r.PayloadLen == 0 || flags&wire.FlagExact != 0 && r.PayloadLen != segsLen(it.segs(true))) {
				// A hit must fill an exact read, and no stored value is empty.
				return fmt.Errorf("%w: item %d: %d-byte hit for a %d-byte read", ErrProtocol, i, r.PayloadLen, segsLen(it.segs(true)))
			}
			if r.PayloadLen != 0 {
				segs := it.segs(true)
				if r.Status != fb.StatusOk || r.PayloadLen > segsLen(segs) {
					return fmt.Errorf("%w: item %d: %d-byte payload (status %d)", ErrProtocol, i, r.PayloadLen, r.Status)
				}
				if err := readSegs(pc, segs, r.PayloadLen); err != nil {
					return err
				}
			}
			lens[i] = int64(r.PayloadLen)
			if r.Status == fb.StatusOk && !it.replica {
				c.hot.learn(it.id, r.Hot)
			}
		case fb.OpBatchExist:
			lens[i] = int64(r.ValueLen)
		case fb.OpBatchExistLease:
			lens[i] = int64(r.ValueLen)
			leased[i] = r.Status == fb.StatusOk && r.Flags&wire.ResultLeased != 0
		case fb.OpBatchPut:
			if r.PayloadLen != 0 {
				return fmt.Errorf("%w: payload in a batch put reply", ErrProtocol)
			}
			lens[i] = int64(segsLen(it.segs(false)))
		}
	}
	return nil
}

// MaxValue returns the largest value every current member accepts: the smaller of this
// client's limit and each server's HELLO-advertised max value size, connecting to members
// it has not talked to yet. Connectors check their object size against it at start so a
// misfit refuses to start instead of failing every PUT.
func (c *Client) MaxValue(ctx context.Context) (uint64, error) {
	if c.closed.Load() {
		return 0, ErrClosed
	}
	limit := c.opts.Limits.MaxValue
	view := c.opts.Membership.View()
	for _, m := range view.Members {
		p := c.peerFor(m)
		if p.limits.Load() == nil {
			if err := c.exec(ctx, p, func(*pconn) error { return nil }); err != nil {
				return 0, fmt.Errorf("dfkv: max value: member %s: %w", m.Addr, err)
			}
		}
		if h := p.limits.Load(); h != nil && h.MaxValueBytes > 0 {
			limit = min(limit, h.MaxValueBytes)
		}
	}
	return limit, nil
}
