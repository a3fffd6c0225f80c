//go:build linux

package ramtier

import (
	"bytes"
	"sync"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
)

// gatedEngine is a backing engine whose Put waits at a gate before writing, and whose Get
// waits at another after reading (the bytes it hands on are those it read): a test can
// hold a write and a read at the points where they interleave.
type gatedEngine struct {
	mem       *store.Mem
	putGate   chan struct{} // a Put waits here before it writes (nil: no wait)
	putHeld   chan struct{} // closed when a Put reached its gate
	readGate  chan struct{} // a Get waits here after reading (nil: no wait)
	readHeld  chan struct{} // closed when a Get reached its gate
	heldOnce  sync.Once
	readsOnce sync.Once
}

func (g *gatedEngine) Put(key store.Key, size int, fill func([]byte) error) error {
	if g.putGate != nil {
		g.heldOnce.Do(func() { close(g.putHeld) })
		<-g.putGate
	}
	return g.mem.Put(key, size, fill)
}

func (g *gatedEngine) Get(key store.Key, fn func([]byte) error) error {
	var read []byte
	if err := g.mem.Get(key, func(v []byte) error { read = bytes.Clone(v); return nil }); err != nil {
		return err
	}
	if g.readGate != nil {
		g.readsOnce.Do(func() { close(g.readHeld) })
		<-g.readGate
	}
	return fn(read)
}

func (g *gatedEngine) Stat(key store.Key) (int64, error) { return g.mem.Stat(key) }
func (g *gatedEngine) Remove(key store.Key) error        { return g.mem.Remove(key) }
func (g *gatedEngine) Stats() store.Stats                { return g.mem.Stats() }
func (g *gatedEngine) Close() error                      { return g.mem.Close() }

// A cold read that started while a write of its key was in flight must not promote what it
// read: the write can land and publish its own value before the read finishes, and the
// read's older bytes would then replace the newer value in RAM while the disk holds the
// newer one (found by TestConcurrentWritesStayConsistent, once in a few hundred runs).
//
// The interleaving, forced: the write has begun (its epoch is taken) but waits before its
// disk write; the read starts, reads the old value and waits; the write lands, publishes
// and returns; the read finishes.
func TestColdReadDuringWriteDoesNotPromoteOldBytes(t *testing.T) {
	g := &gatedEngine{mem: store.NewMem(0)}
	tr := newTier(t, g, Config{ArenaBytes: 4 * mib, Shards: 1, Policy: WriteAround})
	k, old, fresh := key(1), val(1, 8*kib), val(2, 8*kib)
	put(t, tr, k, old) // write-around: on disk only, so the next read is cold

	g.putGate, g.putHeld = make(chan struct{}), make(chan struct{})
	g.readGate, g.readHeld = make(chan struct{}), make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		wrote <- tr.Put(k, len(fresh), func(dst []byte) error { copy(dst, fresh); return nil })
	}()
	<-g.putHeld // the write has taken its epoch and waits before the disk
	read := make(chan []byte, 1)
	go func() {
		var got []byte
		if err := tr.Get(k, func(v []byte) error { got = bytes.Clone(v); return nil }); err != nil {
			t.Error(err)
		}
		read <- got
	}()
	<-g.readHeld // the read has the old bytes
	close(g.putGate)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	close(g.readGate)
	if got := <-read; !bytes.Equal(got, old) && !bytes.Equal(got, fresh) {
		t.Fatal("the read returned bytes of no version")
	}
	g.readGate = nil
	var disk, ram []byte
	if err := g.mem.Get(k, func(v []byte) error { disk = bytes.Clone(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := tr.Get(k, func(v []byte) error { ram = bytes.Clone(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(disk, fresh) {
		t.Fatal("the disk does not hold the last write")
	}
	if !bytes.Equal(ram, fresh) {
		t.Fatal("the tier serves the bytes the cold read saw before the write landed")
	}
}
