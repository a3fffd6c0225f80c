package tagged

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// LogName is the tag log's file name in the first data directory.
const LogName = "kvtags.log"

// Sink receives the lifecycle of tagged objects. Its methods must not block (they run
// with engine locks held); kvevents.Publisher is one.
type Sink interface {
	Stored(t *wire.ObjectTag)
	Removed(t *wire.ObjectTag)
	Cleared()
}

// Options configure Wrap.
type Options struct {
	Dir  string // where the tag log lives
	Sink Sink
	// Fresh says the node starts without (some of) its data: a wiped or lost disk, or a
	// non-persistent engine. Wrap then publishes Cleared, followed by Stored for every
	// tagged object that is still stored.
	Fresh  bool
	Logger *slog.Logger
}

type entry struct {
	tag  *wire.ObjectTag
	size int64
}

// Engine wraps a storage engine with tags. It is safe for concurrent use.
type Engine struct {
	store.Engine
	sink Sink
	log  *slog.Logger

	mu   sync.Mutex // guards tags, w and werr
	tags map[store.Key]entry
	f    *os.File
	w    *bufio.Writer
	werr error
	buf  []byte

	outer  atomic.Pointer[store.RemovalObserver]
	stop   chan struct{}
	done   chan struct{}
	closed atomic.Bool
}

var (
	_ store.Engine     = (*Engine)(nil)
	_ store.Observable = (*Engine)(nil)
	_ store.Unwrapper  = (*Engine)(nil)
)

// Wrap loads the tag log in o.Dir, keeps the tags of objects e still holds (publishing
// Removed for the others), rewrites the log compactly and reports e's removals from now
// on. Wrap it inside layers that install their own removal observer (quota): they then
// install it here, and both see every removal.
func Wrap(e store.Engine, o Options) (*Engine, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	t := &Engine{Engine: e, sink: o.Sink, log: o.Logger, tags: map[store.Key]entry{},
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("tagged: %w", err)
	}
	path := filepath.Join(o.Dir, LogName)
	raw, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tagged: %w", err)
	}
	loaded, cut := replay(raw)
	if cut < len(raw) {
		o.Logger.Warn("tag log: torn or corrupt tail dropped", "path", path, "kept_bytes", cut, "dropped_bytes", len(raw)-cut)
	}
	if o.Fresh {
		o.Sink.Cleared()
	}
	keys := make([]store.Key, 0, len(loaded))
	for k := range loaded {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b store.Key) int {
		return cmp.Or(cmp.Compare(a.ID.Hi, b.ID.Hi), cmp.Compare(a.ID.Lo, b.ID.Lo), cmp.Compare(a.Tenant, b.Tenant))
	})
	for _, k := range keys {
		ent := loaded[k]
		n, err := e.Stat(k)
		switch {
		case err == nil && n == ent.size:
			t.tags[k] = ent
			if o.Fresh {
				o.Sink.Stored(ent.tag)
			}
		case o.Fresh:
			// Cleared already told subscribers to forget it.
		default:
			// Gone while the node was down (e.g. lost in a crash): subscribers were told
			// it was stored, so they hear that it is not.
			o.Sink.Removed(ent.tag)
		}
	}
	if err := t.compact(path); err != nil {
		return nil, err
	}
	store.SetRemovalObserver(e, t.removed)
	go t.flusher()
	return t, nil
}

// replay applies the log's records in order and returns the live tags and the length of
// the valid prefix.
func replay(raw []byte) (map[store.Key]entry, int) {
	m := map[store.Key]entry{}
	off := 0
	for off < len(raw) {
		r, n, err := decodeRec(raw[off:])
		if err != nil {
			break
		}
		off += n
		switch r.kind {
		case recSet:
			tag := r.tag
			m[r.key] = entry{tag: &tag, size: r.size}
		case recDel:
			delete(m, r.key)
		}
	}
	return m, off
}

// compact writes the live tags to a new log and renames it over the old one durably.
func (t *Engine) compact(path string) error {
	var b []byte
	for k, ent := range t.tags {
		b = appendRec(b, &logRec{kind: recSet, key: k, size: ent.size, tag: *ent.tag})
	}
	tmp := path + ".tmp"
	if err := writeSync(tmp, b); err != nil {
		return fmt.Errorf("tagged: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("tagged: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("tagged: %w", err)
	}
	t.f, t.w = f, bufio.NewWriterSize(f, 64<<10)
	return nil
}

func writeSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// flusher writes buffered log records out once a second: a crash loses at most the last
// second of tag changes (those objects then publish nothing, or a stale removal).
func (t *Engine) flusher() {
	defer close(t.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.mu.Lock()
			t.flushLocked()
			t.mu.Unlock()
		}
	}
}

func (t *Engine) flushLocked() {
	if t.werr != nil || t.w == nil || t.w.Buffered() == 0 {
		return
	}
	if err := t.w.Flush(); err != nil {
		t.werr = err
		t.log.Error("tag log: write failed; tags are kept in memory only from now on", "err", err)
	}
}

func (t *Engine) appendLocked(r *logRec) {
	if t.werr != nil {
		return
	}
	t.buf = appendRec(t.buf[:0], r)
	if _, err := t.w.Write(t.buf); err != nil {
		t.werr = err
		t.log.Error("tag log: write failed; tags are kept in memory only from now on", "err", err)
	}
}

// SetTags attaches tags to objects of tenant that are stored here and returns how many
// were attached. An object that is absent is skipped; re-sending an object's current tag
// changes nothing and publishes nothing.
func (t *Engine) SetTags(tenant uint64, tags []wire.ObjectTag) int {
	attached := 0
	for i := range tags {
		tag := tags[i]
		k := store.Key{ID: tag.ID, Tenant: tenant}
		n, err := t.Engine.Stat(k)
		if err != nil {
			continue
		}
		t.mu.Lock()
		old, had := t.tags[k]
		if had && old.size == n && equalTags(old.tag, &tag) {
			t.mu.Unlock()
			attached++
			continue
		}
		t.tags[k] = entry{tag: &tag, size: n}
		t.appendLocked(&logRec{kind: recSet, key: k, size: n, tag: tag})
		if had {
			t.sink.Removed(old.tag)
		}
		t.sink.Stored(&tag)
		t.mu.Unlock()
		attached++
	}
	return attached
}

// Tag returns the tag of key, if it has one.
func (t *Engine) Tag(key store.Key) (wire.ObjectTag, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ent, ok := t.tags[key]
	if !ok {
		return wire.ObjectTag{}, false
	}
	return *ent.tag, true
}

// Tagged is the number of tagged objects.
func (t *Engine) Tagged() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.tags)
}

// removed is the inner engine's removal observer: the outer observer first, then the
// object's tag goes and subscribers hear BlockRemoved.
func (t *Engine) removed(key store.Key, size int64, why store.RemovalReason) {
	if fn := t.outer.Load(); fn != nil {
		(*fn)(key, size, why)
	}
	t.mu.Lock()
	ent, ok := t.tags[key]
	if ok {
		delete(t.tags, key)
		t.appendLocked(&logRec{kind: recDel, key: key})
		t.sink.Removed(ent.tag)
	}
	t.mu.Unlock()
}

// SetRemovalObserver implements store.Observable for the layers above.
func (t *Engine) SetRemovalObserver(fn store.RemovalObserver) {
	if fn == nil {
		t.outer.Store(nil)
		return
	}
	t.outer.Store(&fn)
}

// Unwrap returns the wrapped engine.
func (t *Engine) Unwrap() store.Engine { return t.Engine }

// Close closes the engine, then flushes and syncs the tag log.
func (t *Engine) Close() error {
	err := t.Engine.Close()
	if t.closed.Swap(true) {
		return err
	}
	close(t.stop)
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flushLocked()
	if t.f != nil {
		err = errors.Join(err, t.f.Sync(), t.f.Close())
	}
	return err
}

func equalTags(a, b *wire.ObjectTag) bool {
	if a.ID != b.ID || a.Model != b.Model || a.BlockSize != b.BlockSize || a.LoraID != b.LoraID ||
		a.LoraName != b.LoraName || !slices.Equal(a.TokenIDs, b.TokenIDs) || (a.Parent == nil) != (b.Parent == nil) ||
		len(a.BlockHashes) != len(b.BlockHashes) {
		return false
	}
	if a.Parent != nil && !equalHash(*a.Parent, *b.Parent) {
		return false
	}
	for i := range a.BlockHashes {
		if !equalHash(a.BlockHashes[i], b.BlockHashes[i]) {
			return false
		}
	}
	return true
}

func equalHash(a, b wire.BlockHash) bool {
	return (a.Bytes == nil) == (b.Bytes == nil) && a.Int == b.Int && a.Unsigned == b.Unsigned && slices.Equal(a.Bytes, b.Bytes)
}
