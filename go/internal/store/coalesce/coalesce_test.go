package coalesce

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

// countingEngine counts Gets; the first one waits for gate.
type countingEngine struct {
	store.Engine
	gets  atomic.Int64
	gate  chan struct{}
	first atomic.Bool
}

func (c *countingEngine) Get(k store.Key, fn func([]byte) error) error {
	c.gets.Add(1)
	if c.first.CompareAndSwap(false, true) {
		<-c.gate
	}
	return c.Engine.Get(k, fn)
}

var k1 = store.Key{ID: identity.ObjectID{Hi: 1, Lo: 2}, Tenant: 3}

func setup(t *testing.T, timeout time.Duration) (*countingEngine, *Engine, []byte) {
	mem := store.NewMem(0)
	want := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	if err := mem.Put(k1, len(want), func(d []byte) error { copy(d, want); return nil }); err != nil {
		t.Fatal(err)
	}
	ce := &countingEngine{Engine: mem, gate: make(chan struct{})}
	return ce, Wrap(ce, timeout), want
}

func TestCoalescedGetsShareOneRead(t *testing.T) {
	ce, e, want := setup(t, 30*time.Second)
	const readers = 12
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.Get(k1, func(v []byte) error {
				time.Sleep(time.Millisecond) // the leader's buffer must outlive every follower
				if !bytes.Equal(v, want) {
					bad.Add(1)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	for e.g.Waiting() < readers-1 {
		time.Sleep(time.Millisecond)
	}
	close(ce.gate)
	wg.Wait()
	if n := ce.gets.Load(); n != 1 {
		t.Fatalf("%d engine reads, want 1", n)
	}
	if bad.Load() != 0 {
		t.Fatal("a follower saw wrong bytes")
	}
	if s := e.CoalesceStats(); s.Leaders != 1 || s.Coalesced != readers-1 || s.Timeouts != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Misses are shared too.
	if err := e.Get(store.Key{Tenant: 99}, func([]byte) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("miss: %v", err)
	}
}

func TestStalledLeaderFollowersFallBack(t *testing.T) {
	ce, e, want := setup(t, 50*time.Millisecond)
	leader := make(chan error, 1)
	go func() { leader <- e.Get(k1, func([]byte) error { return nil }) }()
	for ce.gets.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Get(k1, func(v []byte) error {
				if !bytes.Equal(v, want) {
					return errors.New("wrong bytes")
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("followers hung behind a stalled leader")
	}
	if s := e.CoalesceStats(); s.Timeouts != 3 {
		t.Fatalf("stats %+v", s)
	}
	close(ce.gate)
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
}
