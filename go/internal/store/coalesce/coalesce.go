// Package coalesce makes concurrent identical reads share one disk read.
//
// A Group keeps one in-flight read ("flight") per store.Key. The first reader of a key
// leads: it reads and publishes the value; readers that arrive while the flight is open
// follow: they wait (at most Timeout) for the publication and are then served from the
// leader's buffer. The leader keeps that buffer alive for its followers: either by pins it
// takes on their behalf (the RAM tier's arena slots) or by waiting until each follower has
// released it (Engine, for engines whose buffers live only during a Get callback). A
// follower whose leader stalls detaches after Timeout and reads on its own, so a stuck
// disk read never hangs more than one request.
//
// Engine wraps any store.Engine with a Group. The RAM tier (package ramtier) uses a Group
// directly so that its leader reads into the final arena slot.
package coalesce

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// DefaultTimeout bounds how long a follower waits for its leader.
const DefaultTimeout = 500 * time.Millisecond

const numShards = 64

// Group tracks the open flights. The zero value is not usable; call NewGroup.
type Group struct {
	timeout time.Duration
	shards  [numShards]struct {
		mu sync.Mutex
		m  map[store.Key]*Flight
		_  [40]byte
	}
	leaders, coalesced, timeouts atomic.Int64
	waiting                      atomic.Int64 // followers waiting right now
}

// Waiting returns the number of followers waiting for their leader right now.
func (g *Group) Waiting() int64 { return g.waiting.Load() }

// NewGroup returns a Group whose followers wait at most timeout (<= 0: DefaultTimeout).
func NewGroup(timeout time.Duration) *Group {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	g := &Group{timeout: timeout}
	for i := range g.shards {
		g.shards[i].m = make(map[store.Key]*Flight)
	}
	return g
}

// Timeout is the follower wait bound.
func (g *Group) Timeout() time.Duration { return g.timeout }

// Stats returns the counters.
func (g *Group) Stats() store.CoalesceStats {
	return store.CoalesceStats{Leaders: g.leaders.Load(), Coalesced: g.coalesced.Load(), Timeouts: g.timeouts.Load()}
}

// Flight is one shared read.
type Flight struct {
	g     *Group
	key   store.Key
	ready chan struct{}

	mu      sync.Mutex
	done    bool
	val     []byte
	err     error
	waiting int    // followers registered and not detached
	release func() // called once by each served follower
}

func (g *Group) shardOf(k store.Key) int {
	h := k.ID.Lo ^ k.ID.Hi*0x9e3779b97f4a7c15 ^ k.Tenant
	return int((h ^ h>>31) % numShards)
}

// Join returns key's open flight, or opens one. leader is true for the caller that opened
// it: it must call Publish (exactly once; later calls are ignored) on every path.
func (g *Group) Join(key store.Key) (f *Flight, leader bool) {
	sh := &g.shards[g.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if f := sh.m[key]; f != nil {
		// Registered under the shard lock: a Publish that has not yet removed the flight
		// from the map will count this follower.
		f.mu.Lock()
		f.waiting++
		f.mu.Unlock()
		return f, false
	}
	f = &Flight{g: g, key: key, ready: make(chan struct{})}
	sh.m[key] = f
	g.leaders.Add(1)
	return f, true
}

// Publish ends the flight with a value or an error. On success with followers waiting,
// hold(n) is called (with the flight locked) before any of the n followers can see val:
// it must keep val valid until release has been called n times.
func (f *Flight) Publish(val []byte, err error, hold func(n int), release func()) {
	g := f.g
	sh := &g.shards[g.shardOf(f.key)]
	sh.mu.Lock()
	if sh.m[f.key] == f {
		delete(sh.m, f.key)
	}
	sh.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return
	}
	f.done = true
	f.err = err
	if err == nil {
		f.val = val
		f.release = release
		if f.waiting > 0 && hold != nil {
			hold(f.waiting)
		}
	}
	close(f.ready)
}

// Fail ends the flight with err (if it is still open): followers see err.
func (f *Flight) Fail(err error) { f.Publish(nil, err, nil, nil) }

// Wait is a follower's wait for the flight. ok is false when the leader did not publish
// within the group's timeout: the follower has detached and must read on its own. When ok
// and err is nil, the follower must call done() after its last use of val.
func (f *Flight) Wait() (val []byte, done func(), err error, ok bool) {
	f.g.waiting.Add(1)
	defer f.g.waiting.Add(-1)
	t := time.NewTimer(f.g.timeout)
	select {
	case <-f.ready:
		t.Stop()
	case <-t.C:
		f.mu.Lock()
		if !f.done {
			f.waiting--
			f.mu.Unlock()
			f.g.timeouts.Add(1)
			return nil, nil, nil, false
		}
		f.mu.Unlock() // published while the timer fired: take it
	}
	f.mu.Lock()
	val, err, rel := f.val, f.err, f.release
	f.mu.Unlock()
	f.g.coalesced.Add(1)
	if err != nil {
		return nil, func() {}, err, true
	}
	if rel == nil {
		rel = func() {}
	}
	return val, rel, nil, true
}

// Shared publishes a value that is valid only until the leader returns (e.g. inside an
// engine's Get callback) and returns a function that blocks until every follower served
// from it has released it. Call the returned function before the buffer goes away.
func (f *Flight) Shared(val []byte) (wait func()) {
	var mu sync.Mutex
	var left int
	var drained chan struct{}
	hold := func(n int) {
		left = n
		drained = make(chan struct{})
	}
	release := func() {
		mu.Lock()
		left--
		if left == 0 {
			close(drained)
		}
		mu.Unlock()
	}
	f.Publish(val, nil, func(n int) { mu.Lock(); hold(n); mu.Unlock() }, release)
	return func() {
		mu.Lock()
		ch := drained
		mu.Unlock()
		if ch != nil {
			<-ch
		}
	}
}

// Engine coalesces concurrent identical Gets of the engine it wraps; every other method
// passes through.
type Engine struct {
	store.Engine
	g *Group
}

var (
	_ store.Engine    = (*Engine)(nil)
	_ store.Coalescer = (*Engine)(nil)
)

// Wrap returns e with read coalescing; followers wait at most timeout for a leader.
func Wrap(e store.Engine, timeout time.Duration) *Engine {
	return &Engine{Engine: e, g: NewGroup(timeout)}
}

// Unwrap returns the wrapped engine.
func (e *Engine) Unwrap() store.Engine { return e.Engine }

// Coalescing implements store.Coalescer.
func (e *Engine) Coalescing() bool { return true }

// CoalesceStats implements store.Coalescer.
func (e *Engine) CoalesceStats() store.CoalesceStats { return e.g.Stats() }

// Get reads key once for all concurrent callers: the leader's callback lends the engine's
// buffer to its followers and returns only after they are done with it.
func (e *Engine) Get(key store.Key, fn func([]byte) error) error {
	f, leader := e.g.Join(key)
	if !leader {
		v, done, err, ok := f.Wait()
		if !ok {
			return e.Engine.Get(key, fn) // the leader stalled: read on our own
		}
		if err != nil {
			return err
		}
		defer done()
		return fn(v)
	}
	published := false
	err := e.Engine.Get(key, func(v []byte) error {
		published = true
		wait := f.Shared(v)
		ferr := fn(v)
		wait()
		return ferr
	})
	if !published {
		if err == nil {
			err = store.ErrNotFound // an engine that returned without a value: a miss
		}
		f.Fail(err)
	}
	return err
}
