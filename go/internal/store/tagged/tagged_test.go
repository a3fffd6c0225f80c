//go:build linux

package tagged

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder is a Sink that keeps what it was told, as "stored:<hash>" lines.
type recorder struct {
	mu  sync.Mutex
	evs []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.evs = append(r.evs, s); r.mu.Unlock() }
func (r *recorder) Stored(t *wire.ObjectTag) {
	r.add(fmt.Sprintf("stored:%d", t.BlockHashes[0].Int))
}
func (r *recorder) Removed(t *wire.ObjectTag) {
	r.add(fmt.Sprintf("removed:%d", t.BlockHashes[0].Int))
}
func (r *recorder) Cleared() { r.add("cleared") }
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
	return out
}

func key(i int) store.Key {
	return store.Key{ID: identity.Object([]byte("ns"), []byte(fmt.Sprint("k", i))), Tenant: 7}
}

func tagOf(i int) wire.ObjectTag {
	return wire.ObjectTag{ID: key(i).ID, Model: "m", BlockHashes: []wire.BlockHash{{Int: int64(i)}}, BlockSize: 16, LoraID: -1}
}

func slabCfg(dir string) slab.Config {
	return slab.Config{Dir: dir, CapacityBytes: 8 << 20, ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20, BufferPoolBytes: 8 << 20, Logger: quiet}
}

func put(t *testing.T, e store.Engine, i int, size int) {
	t.Helper()
	v := bytes.Repeat([]byte{byte(i)}, size)
	if err := store.PutFrom(e, key(i), v, size); err != nil {
		// PutFrom wants aligned buffers for direct engines; fall back to Put.
		if err := e.Put(key(i), size, func(dst []byte) error { copy(dst, v); return nil }); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

func mustEqual(t *testing.T, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func openSlab(t *testing.T, dir string, rec *recorder, fresh bool) *Engine {
	t.Helper()
	s, err := slab.Open(slabCfg(dir))
	if err != nil {
		t.Fatal(err)
	}
	e, err := Wrap(s, Options{Dir: dir, Sink: rec, Fresh: fresh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLifecycleAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	rec := &recorder{}

	// A directory written by a store without tags (today's slab, no tag log) opens and
	// serves unchanged, and its untagged objects publish nothing, now or when removed.
	s, err := slab.Open(slabCfg(dir))
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, 100, 5000)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	e := openSlab(t, dir, rec, false)
	if n, err := e.Stat(key(100)); err != nil || n != 5000 {
		t.Fatalf("old object: %d %v", n, err)
	}
	mustEqual(t, rec.take())

	for i := 1; i <= 3; i++ {
		put(t, e, i, 4096)
	}
	tags := []wire.ObjectTag{tagOf(1), tagOf(2), tagOf(3), tagOf(99)} // 99 is not stored
	if n := e.SetTags(7, tags); n != 3 {
		t.Fatalf("attached %d, want 3", n)
	}
	if n := e.SetTags(7, tags[:1]); n != 1 { // the same tag again: nothing new
		t.Fatalf("re-attach %d", n)
	}
	if n := e.SetTags(8, []wire.ObjectTag{tagOf(1)}); n != 0 { // another tenant's key
		t.Fatalf("other tenant attached %d", n)
	}
	mustEqual(t, rec.take(), "stored:1", "stored:2", "stored:3")

	if err := e.Remove(key(1)); err != nil {
		t.Fatal(err)
	}
	put(t, e, 2, 8192) // overwrite: the old version's blocks leave
	if err := e.Remove(key(100)); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, rec.take(), "removed:1", "removed:2")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart with the data intact: nothing is published, the tag of 3 is kept.
	e = openSlab(t, dir, rec, false)
	mustEqual(t, rec.take())
	if tg, ok := e.Tag(key(3)); !ok || tg.BlockHashes[0].Int != 3 {
		t.Fatalf("tag of 3 after restart: %v %v", tg, ok)
	}
	if e.Tagged() != 1 {
		t.Fatalf("%d tagged after restart, want 1", e.Tagged())
	}
	if err := e.Remove(key(3)); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, rec.take(), "removed:3")
	e.SetTags(7, []wire.ObjectTag{tagOf(2)})
	mustEqual(t, rec.take(), "stored:2")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart after the disk lost its data (wiped; the tag log survived elsewhere):
	// AllBlocksCleared, and nothing claims the lost objects.
	log, err := os.ReadFile(filepath.Join(dir, LogName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, LogName), log, 0o600); err != nil {
		t.Fatal(err)
	}
	e = openSlab(t, dir, rec, true)
	mustEqual(t, rec.take(), "cleared")
	if e.Tagged() != 0 {
		t.Fatalf("%d tags survive a wiped disk", e.Tagged())
	}
	e.Close()
}

func TestEvictionPublishesRemoved(t *testing.T) {
	rec := &recorder{}
	e, err := Wrap(store.NewMem(64<<10), Options{Dir: t.TempDir(), Sink: rec, Fresh: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mustEqual(t, rec.take(), "cleared")
	for i := 0; i < 4; i++ {
		put(t, e, i, 16<<10)
		e.SetTags(7, []wire.ObjectTag{tagOf(i)})
	}
	for i := 4; i < 12; i++ {
		put(t, e, i, 16<<10) // untagged: pushes the tagged ones out
	}
	got := rec.take()
	removed := 0
	for _, s := range got {
		if len(s) > 8 && s[:8] == "removed:" {
			removed++
		}
	}
	if removed != 4 || e.Tagged() != 0 {
		t.Fatalf("events %v (tagged left %d): want the 4 tagged objects evicted", got, e.Tagged())
	}
}

// A crash can leave a torn tail: the log is cut there and the rest is kept.
func TestTornLogTail(t *testing.T) {
	var b []byte
	for i := 0; i < 3; i++ {
		b = appendRec(b, &logRec{kind: recSet, key: key(i), size: 10, tag: tagOf(i)})
	}
	b = appendRec(b, &logRec{kind: recDel, key: key(1)})
	full := len(b)
	b = append(b, appendRec(nil, &logRec{kind: recSet, key: key(5), size: 10, tag: tagOf(5)})[:20]...)
	m, cut := replay(b)
	if cut != full || len(m) != 2 {
		t.Fatalf("cut at %d of %d, %d tags", cut, len(b), len(m))
	}
	if _, ok := m[key(1)]; ok {
		t.Fatal("deleted tag survived replay")
	}
}

func FuzzDecodeRec(f *testing.F) {
	f.Add(appendRec(nil, &logRec{kind: recSet, key: key(1), size: 10, tag: tagOf(1)}))
	f.Add(appendRec(nil, &logRec{kind: recDel, key: key(1)}))
	f.Add([]byte{25, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, n, err := decodeRec(data)
		if err != nil {
			return
		}
		if n > len(data) || n < recHead+recKeyLen {
			t.Fatalf("length %d of %d", n, len(data))
		}
		again, m, err := decodeRec(appendRec(nil, &r))
		if err != nil || m != n && r.kind == recDel || again.key != r.key || again.kind != r.kind {
			t.Fatalf("re-encode: %+v %v", again, err)
		}
	})
}
