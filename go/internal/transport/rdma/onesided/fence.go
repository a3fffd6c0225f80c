package onesided

import (
	"sync/atomic"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Generation fencing (docs/RDMA.md, "Generation fencing"). Every client QP gets a
// process-unique generation; each wr_id it posts is generation<<32 | slot. A completion
// whose generation is not the connection's own (a late completion of an earlier QP landing
// on a CQ that a reconnect reuses or shares) is dropped and counted, never matched to a
// request of the new connection, whose slot numbers restart at 0.

// slotMask keeps a wr_id's slot half.
const slotMask = 1<<32 - 1

var lastGen atomic.Uint32

// nextGen returns a fresh generation, never 0 (a wr_id of 0 is what an untagged poster
// would use).
func nextGen() uint32 {
	for {
		if g := lastGen.Add(1); g != 0 {
			return g
		}
	}
}

func (c *Client) wrID(slot int) uint64 { return uint64(c.gen)<<32 | uint64(slot) }

// Generation is this connection's QP generation (the high half of its wr_ids).
func (c *Client) Generation() uint32 { return c.gen }

// StaleDropped counts the completions this connection dropped as another generation's.
func (c *Client) StaleDropped() int64 { return c.staleN.Load() }

// stale reports (and counts) a completion of another generation.
func (c *Client) stale(wc verbs.WorkCompletion) bool {
	if uint32(wc.ID>>32) == c.gen {
		return false
	}
	c.staleN.Add(1)
	c.M.StaleCompletions.Add(1)
	c.cfg.Logger.Debug("onesided: dropped a completion of another QP generation", "gen", c.gen,
		"wr_gen", wc.ID>>32, "qp", wc.QPNum, "status", wc.Status)
	return true
}
