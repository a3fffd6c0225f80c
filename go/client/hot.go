package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Hot objects (docs/ARCHITECTURE.md "Hot objects"): a primary that replicates a hot key
// says so in its GET replies; the client remembers it in a bounded table and spreads its
// reads of that key over the primary and the replicas, each client sticking to one copy.
// A replica that misses or fails sends the read back to the primary, never to NotFound.

// maxHotKeys bounds the client's table of hot keys.
const maxHotKeys = 4096

type hotSeen struct {
	replicas uint8
	skip     bool // the primary left the rotation (wire.Hot.SkipPrimary)
	until    time.Time
}

type hotTable struct {
	mu   sync.Mutex
	keys map[identity.ObjectID]hotSeen
	salt uint64        // where this client starts among the copies
	next atomic.Uint64 // rotation: successive reads go to successive copies
}

func newHotTable() *hotTable {
	return &hotTable{keys: map[identity.ObjectID]hotSeen{}, salt: rand.Uint64()}
}

// learn records a reply's hint about id (a zero hint forgets it).
func (t *hotTable) learn(id identity.ObjectID, h wire.Hot) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.Replicas == 0 || h.ValidMS == 0 {
		delete(t.keys, id)
		return
	}
	if _, ok := t.keys[id]; !ok && len(t.keys) >= maxHotKeys {
		now := time.Now()
		for k, s := range t.keys {
			if now.After(s.until) {
				delete(t.keys, k)
			}
		}
		if len(t.keys) >= maxHotKeys {
			return // full of live hints: this key is read from its primary
		}
	}
	t.keys[id] = hotSeen{replicas: h.Replicas, skip: h.SkipPrimary, until: time.Now().Add(time.Duration(h.ValidMS) * time.Millisecond)}
}

// pick returns which copy of id this read goes to: 0 = the primary, i = the i-th replica.
// Each client rotates over all copies from its own starting point: sticking to one copy per
// client would spread a key over at most as many nodes as there are clients, and with few
// engine processes two of them landing on one node made it the busiest (32-node replay).
// When the primary says so (SkipPrimary) the rotation covers the replicas alone.
func (t *hotTable) pick(id identity.ObjectID) (idx, replicas int) {
	t.mu.Lock()
	s, ok := t.keys[id]
	t.mu.Unlock()
	if !ok || time.Now().After(s.until) {
		return 0, 0
	}
	x := (t.salt ^ id.Lo ^ id.Hi*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	x ^= x >> 32
	x += t.next.Add(1)
	if s.skip {
		return 1 + int(x%uint64(s.replicas)), int(s.replicas)
	}
	return int(x % uint64(s.replicas+1)), int(s.replicas)
}

// replicaPeer returns the peer holding the copy of id this client reads, or nil for the
// primary (not hot, the primary picked, or the replica cooling down).
func (c *Client) replicaPeer(id identity.ObjectID) *peer {
	if c.opts.NoHotSpread || c.opts.RDMA != nil {
		return nil
	}
	idx, n := c.hot.pick(id)
	if idx == 0 {
		return nil
	}
	owners := c.opts.Membership.View().Owners(id.Hi, n+1)
	if idx >= len(owners) {
		return nil
	}
	p := c.peerFor(owners[idx])
	if p.cooling() {
		return nil
	}
	return p
}

// ReplicaPut stores value as the hot-object replica of (tenant, id) on the node at addr,
// generation gen, valid for lease, and returns the reads that node served from its replica
// of the key since the previous push (what the primary's heat estimate adds up). Node to
// node: primaries call it, applications do not.
func (c *Client) ReplicaPut(ctx context.Context, addr string, tenant uint64, id identity.ObjectID, gen uint64, lease time.Duration, value []byte) (reads uint64, err error) {
	if c.closed.Load() {
		return 0, ErrClosed
	}
	ms := uint64(lease / time.Millisecond)
	if len(value) == 0 || ms == 0 {
		return 0, fmt.Errorf("dfkv: replica put: empty value or lease: %w", ErrInvalid)
	}
	p := c.peerFor(Member{ID: addr, Addr: addr})
	err = c.exec(ctx, p, func(pc *pconn) error {
		req := wire.Request{Op: fb.OpPut, Flags: wire.FlagReplica, Tenant: tenant, ID: id, Offset: gen, Length: ms, PayloadLen: uint64(len(value))}
		if err := pc.send(&req, value); err != nil {
			return err
		}
		resp, err := pc.recv(fb.OpPut)
		if err != nil {
			return err
		}
		if err := statusReply(resp); err != nil {
			return err
		}
		reads = resp.ValueLen
		return nil
	})
	return reads, err
}

// ReplicaInvalidate drops the hot-object replica of (tenant, id) on the node at addr and
// makes it refuse generations below gen. Node to node, like ReplicaPut.
func (c *Client) ReplicaInvalidate(ctx context.Context, addr string, tenant uint64, id identity.ObjectID, gen uint64) error {
	if c.closed.Load() {
		return ErrClosed
	}
	p := c.peerFor(Member{ID: addr, Addr: addr})
	return c.exec(ctx, p, func(pc *pconn) error {
		req := wire.Request{Op: fb.OpRemove, Flags: wire.FlagReplica, Tenant: tenant, ID: id, Offset: gen}
		if err := pc.send(&req); err != nil {
			return err
		}
		resp, err := pc.recv(fb.OpRemove)
		if err != nil {
			return err
		}
		return statusReply(resp)
	})
}
