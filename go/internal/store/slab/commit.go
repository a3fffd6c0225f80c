//go:build linux

package slab

import "sync"

// groupSync makes writes to one file durable with shared fdatasyncs: a caller that has
// finished its pwrite calls commit, and one fdatasync started after that point covers
// every writer that arrived before it. Concurrent writers therefore pay for about two
// fsyncs in total rather than one each.
type groupSync struct {
	syncFn func() error

	mu        sync.Mutex
	cond      *sync.Cond
	requested uint64 // tickets handed out
	durable   uint64 // every ticket <= durable is on disk
	failed    uint64 // tickets <= failed (and > durable at that time) saw failErr
	failErr   error
	running   bool
	syncs     uint64
}

func newGroupSync(fn func() error) *groupSync {
	g := &groupSync{syncFn: fn}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// commit returns once every write completed before the call is durable.
func (g *groupSync) commit() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.requested++
	t := g.requested
	for g.durable < t {
		if t <= g.failed {
			return g.failErr
		}
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		target := g.requested
		g.mu.Unlock()
		err := g.syncFn()
		g.mu.Lock()
		g.running = false
		g.syncs++
		if err != nil {
			g.failed, g.failErr = target, err
		} else {
			g.durable = target
		}
		g.cond.Broadcast()
	}
	return nil
}
