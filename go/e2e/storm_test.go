package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dfkv/dfkv/go/client"
)

// The write storm shared by the kill -9 tests: values written before the storm, concurrent
// writers that record what they attempted and what was acknowledged, and the check after a
// restart (every key NotFound or byte-exact; every acknowledged write present).

type sizedKey struct {
	key  string
	size int
}

// preload writes n values "before-i" of log-uniform sizes in [4 KiB, 2 MiB].
func preload(t *testing.T, c *client.Client, n int, seed uint64) []sizedKey {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed+1))
	out := make([]sizedKey, 0, n)
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("before-%d", i)
		size := logUniform(r, 4<<10, 2<<20)
		if err := c.Put(context.Background(), []byte(k), value(k, 0, size)); err != nil {
			t.Fatal(err)
		}
		out = append(out, sizedKey{k, size})
	}
	return out
}

type storm struct {
	mu        sync.Mutex
	acked     map[string]int
	attempted map[string]int
	stop      atomic.Bool
	wg        sync.WaitGroup
	total     atomic.Int64 // acknowledged writes
}

// startStorm runs writers that put "storm-w-i" values (4 KiB..1 MiB) until halted or the
// server dies under them.
func startStorm(c *client.Client, writers int, seed uint64) *storm {
	s := &storm{acked: map[string]int{}, attempted: map[string]int{}}
	for w := 0; w < writers; w++ {
		s.wg.Add(1)
		go func(w int) {
			defer s.wg.Done()
			rr := rand.New(rand.NewPCG(uint64(w), seed))
			for i := 0; !s.stop.Load() && i < 100000; i++ {
				k := fmt.Sprintf("storm-%d-%d", w, i)
				n := logUniform(rr, 4<<10, 1<<20)
				s.mu.Lock()
				s.attempted[k] = n
				s.mu.Unlock()
				if err := c.Put(context.Background(), []byte(k), value(k, 0, n)); err != nil {
					return // the server died under us
				}
				s.total.Add(1)
				s.mu.Lock()
				s.acked[k] = n
				s.mu.Unlock()
			}
		}(w)
	}
	return s
}

// also runs fn alongside the writers until the storm is halted (fn polls stopped).
func (s *storm) also(fn func(stopped func() bool)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn(s.stop.Load)
	}()
}

// halt stops every goroutine of the storm and waits for them.
func (s *storm) halt() {
	s.stop.Store(true)
	s.wg.Wait()
}

// verify reads every preloaded and attempted key through c: wrong bytes fail the test at
// once; it returns how many acknowledged writes are missing.
func (s *storm) verify(t *testing.T, c *client.Client, before []sizedKey) (lostAcked int) {
	t.Helper()
	buf := make([]byte, 2<<20)
	for _, b := range before {
		n, err := c.GetAuto(context.Background(), []byte(b.key), buf)
		if err != nil || !bytes.Equal(buf[:n], value(b.key, 0, b.size)) {
			t.Fatalf("pre-storm write %s lost or wrong after kill -9: n=%d err=%v", b.key, n, err)
		}
	}
	for k, size := range s.attempted {
		n, err := c.GetAuto(context.Background(), []byte(k), buf)
		switch {
		case errors.Is(err, client.ErrNotFound):
			if _, ok := s.acked[k]; ok {
				lostAcked++
			}
		case err != nil:
			t.Fatalf("get %s: %v", k, err)
		case !bytes.Equal(buf[:n], value(k, 0, size)):
			t.Fatalf("storm key %s returned wrong bytes after kill -9 (%d bytes)", k, n)
		}
	}
	return lostAcked
}
