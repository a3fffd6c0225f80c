//go:build linux

package file

import (
	"container/list"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

const (
	objectsDir = "objects"
	tmpDir     = "tmp"
	lockName   = "file.lock"
	stripes    = 64

	// DefaultMaxValueBytes is the largest value accepted when Config.MaxValueBytes is 0.
	DefaultMaxValueBytes = 64 << 20
)

// Config describes one file engine (one directory).
type Config struct {
	Dir           string
	CapacityBytes int64 // value bytes the engine may hold; the oldest values are evicted beyond it
	MaxValueBytes int64 // default 64 MiB
	Logger        *slog.Logger
	// FS is the file system under the engine; nil means vfs.Default (tests inject faults).
	FS vfs.FS
}

func (c Config) withDefaults() Config {
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = DefaultMaxValueBytes
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports configuration errors.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("dir is empty"))
	}
	if c.CapacityBytes <= 0 {
		errs = append(errs, fmt.Errorf("capacity %d is not positive", c.CapacityBytes))
	}
	if c.MaxValueBytes <= 0 || c.MaxValueBytes > c.CapacityBytes {
		errs = append(errs, fmt.Errorf("max value size %d must be in 1..capacity (%d)", c.MaxValueBytes, c.CapacityBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("file: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

var (
	_ store.Engine     = (*Engine)(nil)
	_ store.Observable = (*Engine)(nil)
	_ store.Lister     = (*Engine)(nil)
)

// Engine stores one file per value. It is safe for concurrent use.
type Engine struct {
	cfg  Config
	fs   vfs.FS
	log  *slog.Logger
	lock io.Closer

	// stripe locks serialize renames and unlinks of one key's file with its index update.
	stripe [stripes]sync.Mutex

	mu    sync.Mutex // guards index, order, used and gen
	index map[store.Key]*entry
	order *list.List // oldest first
	used  int64      // value bytes stored plus bytes reserved by in-flight Puts
	gen   uint64

	closed   atomic.Bool
	inflight atomic.Int64
	observer store.RemovalObserver // guarded by mu

	nEvictions, nEvictedBytes, nCorrupt           atomic.Int64
	nReadBytes, nWriteBytes, nReads, nWrites, nIO atomic.Int64
}

type entry struct {
	key  store.Key
	size int64
	gen  uint64
	elem *list.Element
}

// Open opens (creating if needed) a file engine and rebuilds its index by walking the
// object directory.
func Open(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: cfg.Logger.With("engine", "file", "dir", cfg.Dir), fs: cfg.FS,
		index: make(map[store.Key]*entry), order: list.New()}
	if err := e.open(); err != nil {
		if e.lock != nil {
			e.lock.Close()
		}
		return nil, fmt.Errorf("file: open %s: %w", cfg.Dir, err)
	}
	return e, nil
}

func (e *Engine) open() error {
	for _, d := range []string{objectsDir, tmpDir} {
		if err := e.fs.MkdirAll(filepath.Join(e.cfg.Dir, d), 0o700); err != nil {
			return err
		}
	}
	lock, err := e.fs.Lock(filepath.Join(e.cfg.Dir, lockName))
	if err != nil {
		return err
	}
	e.lock = lock
	// Leftover temp files are writes that never completed.
	tmps, _ := e.fs.ReadDir(filepath.Join(e.cfg.Dir, tmpDir))
	for _, t := range tmps {
		_ = e.fs.Remove(filepath.Join(e.cfg.Dir, tmpDir, t.Name()))
	}
	type found struct {
		key   store.Key
		size  int64
		mtime time.Time
	}
	var all []found
	bad := 0
	root := filepath.Join(e.cfg.Dir, objectsDir)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		key, ok := parseName(d.Name())
		if !ok || info.Size() < headerSize+1 || e.path(key) != path {
			bad++
			_ = e.fs.Remove(path)
			return nil
		}
		all = append(all, found{key, info.Size() - headerSize, info.ModTime()})
		return nil
	})
	if err != nil {
		return fmt.Errorf("walk %s: %w", root, err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mtime.Before(all[j].mtime) })
	for _, f := range all {
		e.insertLocked(f.key, f.size)
	}
	// A smaller capacity than last time: drop the oldest values now.
	for e.used > e.cfg.CapacityBytes {
		victim := e.order.Front().Value.(*entry)
		e.deleteLocked(victim, store.Evicted)
		_ = e.fs.Remove(e.path(victim.key))
	}
	e.log.Info("file: opened", "objects", len(e.index), "used_bytes", e.used, "bad_files", bad)
	return nil
}

// path returns dir/objects/ab/cd/<id>-<tenant>.
func (e *Engine) path(k store.Key) string {
	id := k.ID.String()
	return filepath.Join(e.cfg.Dir, objectsDir, id[0:2], id[2:4], id+"-"+fmt.Sprintf("%016x", k.Tenant))
}

func parseName(name string) (store.Key, bool) {
	if len(name) != 32+1+16 || name[32] != '-' {
		return store.Key{}, false
	}
	hi, err1 := strconv.ParseUint(name[0:16], 16, 64)
	lo, err2 := strconv.ParseUint(name[16:32], 16, 64)
	ten, err3 := strconv.ParseUint(name[33:], 16, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return store.Key{}, false
	}
	return store.Key{ID: identity.ObjectID{Hi: hi, Lo: lo}, Tenant: ten}, true
}

func (e *Engine) stripeOf(k store.Key) *sync.Mutex {
	return &e.stripe[(k.ID.Lo^k.ID.Hi^k.Tenant)%stripes]
}

func (e *Engine) insertLocked(k store.Key, size int64) {
	if old := e.index[k]; old != nil {
		e.deleteLocked(old, store.Replaced)
	}
	e.gen++
	ent := &entry{key: k, size: size, gen: e.gen}
	ent.elem = e.order.PushBack(ent)
	e.index[k] = ent
	e.used += size
}

func (e *Engine) deleteLocked(ent *entry, why store.RemovalReason) {
	delete(e.index, ent.key)
	e.order.Remove(ent.elem)
	e.used -= ent.size
	if e.observer != nil {
		e.observer(ent.key, ent.size, why)
	}
}

// SetRemovalObserver implements store.Observable; the observer runs under the index lock.
func (e *Engine) SetRemovalObserver(fn store.RemovalObserver) {
	e.mu.Lock()
	e.observer = fn
	e.mu.Unlock()
}

// ForEach implements store.Lister.
func (e *Engine) ForEach(fn func(store.Key, int64) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, ent := range e.index {
		if !fn(k, ent.size) {
			return
		}
	}
}

func (e *Engine) enter() error {
	e.inflight.Add(1)
	if e.closed.Load() {
		e.inflight.Add(-1)
		return fmt.Errorf("file: %s: %w", e.cfg.Dir, store.ErrClosed)
	}
	return nil
}

func (e *Engine) leave() { e.inflight.Add(-1) }

// Put writes the value to a temp file, fsyncs it, renames it into place and fsyncs the
// directory before the value becomes visible.
func (e *Engine) Put(key store.Key, size int, fill func(dst []byte) error) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if size <= 0 {
		return fmt.Errorf("file: put %s: size %d: %w", key.ID, size, store.ErrInvalid)
	}
	if int64(size) > e.cfg.MaxValueBytes {
		return fmt.Errorf("file: put %s: %d bytes, max %d: %w", key.ID, size, e.cfg.MaxValueBytes, store.ErrTooLarge)
	}
	buf := make([]byte, headerSize+size)
	if err := fill(buf[headerSize:]); err != nil {
		return err
	}
	h := header{Length: uint64(size), CRC: crc32.Checksum(buf[headerSize:], castagnoli), Key: key}
	h.encode(buf)

	e.reserve(int64(size))
	committed := false
	defer func() {
		if !committed {
			e.mu.Lock()
			e.used -= int64(size)
			e.mu.Unlock()
		}
	}()
	tmp, err := e.writeTemp(buf)
	if err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("file: put %s: %w", key.ID, ioErr(err))
	}
	e.nWrites.Add(1)
	e.nWriteBytes.Add(int64(size))
	final := e.path(key)
	mu := e.stripeOf(key)
	mu.Lock()
	defer mu.Unlock()
	if err := e.fs.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		_ = e.fs.Remove(tmp)
		e.nIO.Add(1)
		return fmt.Errorf("file: put %s: %w", key.ID, ioErr(err))
	}
	if err := e.fs.Rename(tmp, final); err != nil {
		_ = e.fs.Remove(tmp)
		e.nIO.Add(1)
		return fmt.Errorf("file: put %s: %w", key.ID, ioErr(err))
	}
	if err := e.fs.SyncDir(filepath.Dir(final)); err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("file: put %s: sync dir: %w", key.ID, ioErr(err))
	}
	e.mu.Lock()
	e.used -= int64(size) // the reservation becomes the entry
	e.insertLocked(key, int64(size))
	e.mu.Unlock()
	committed = true
	return nil
}

// reserve charges size bytes, evicting the oldest values until they fit.
func (e *Engine) reserve(size int64) {
	var victims []*entry
	e.mu.Lock()
	for e.used+size > e.cfg.CapacityBytes && e.order.Len() > 0 {
		v := e.order.Front().Value.(*entry)
		e.deleteLocked(v, store.Evicted)
		victims = append(victims, v)
		e.nEvictions.Add(1)
		e.nEvictedBytes.Add(v.size)
	}
	e.used += size
	e.mu.Unlock()
	for _, v := range victims {
		e.unlinkIfAbsent(v.key)
	}
}

// unlinkIfAbsent removes a key's file unless a Put has re-added the key meanwhile.
func (e *Engine) unlinkIfAbsent(k store.Key) {
	mu := e.stripeOf(k)
	mu.Lock()
	defer mu.Unlock()
	e.mu.Lock()
	_, back := e.index[k]
	e.mu.Unlock()
	if !back {
		_ = e.fs.Remove(e.path(k))
	}
}

func (e *Engine) writeTemp(buf []byte) (string, error) {
	f, err := e.fs.CreateTemp(filepath.Join(e.cfg.Dir, tmpDir), "put-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = e.fs.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// Get reads and verifies the value; a value that fails verification is dropped.
func (e *Engine) Get(key store.Key, fn func(value []byte) error) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	e.mu.Lock()
	ent := e.index[key]
	var gen uint64
	if ent != nil {
		gen = ent.gen
	}
	e.mu.Unlock()
	if ent == nil {
		return fmt.Errorf("file: get %s: %w", key.ID, store.ErrNotFound)
	}
	value, err := e.read(key)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("file: get %s: %w", key.ID, store.ErrNotFound) // removed meanwhile
	}
	if errors.Is(err, store.ErrCorrupt) {
		e.nCorrupt.Add(1)
		e.drop(key, gen)
		e.log.Warn("file: value failed verification; dropped", "object", key.ID.String(), "err", err)
		return fmt.Errorf("file: get %s: %w: %w", key.ID, store.ErrNotFound, err)
	}
	if err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("file: get %s: %w", key.ID, ioErr(err))
	}
	return fn(value)
}

func (e *Engine) read(key store.Key) ([]byte, error) {
	f, err := e.fs.OpenFile(e.path(key), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hb [headerSize]byte
	if _, err := io.ReadFull(f, hb[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("short header: %w", store.ErrCorrupt)
		}
		return nil, err
	}
	h, err := decodeHeader(hb[:])
	if err != nil || h.Key != key || h.Length == 0 || h.Length > uint64(e.cfg.MaxValueBytes) {
		return nil, fmt.Errorf("header: %w", store.ErrCorrupt)
	}
	value := make([]byte, h.Length)
	n, err := io.ReadFull(f, value)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("short value (%d of %d bytes): %w", n, h.Length, store.ErrCorrupt)
	}
	if err != nil {
		return nil, err
	}
	e.nReads.Add(1)
	e.nReadBytes.Add(int64(n))
	if crc32.Checksum(value, castagnoli) != h.CRC {
		return nil, fmt.Errorf("payload CRC mismatch: %w", store.ErrCorrupt)
	}
	return value, nil
}

// drop removes a corrupt value if it is still the generation that was read.
func (e *Engine) drop(key store.Key, gen uint64) {
	mu := e.stripeOf(key)
	mu.Lock()
	defer mu.Unlock()
	e.mu.Lock()
	ent := e.index[key]
	if ent == nil || ent.gen != gen {
		e.mu.Unlock()
		return
	}
	e.deleteLocked(ent, store.Dropped)
	e.mu.Unlock()
	_ = e.fs.Remove(e.path(key))
}

// Stat returns the stored length of a value.
func (e *Engine) Stat(key store.Key) (int64, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	e.mu.Lock()
	defer e.mu.Unlock()
	if ent := e.index[key]; ent != nil {
		return ent.size, nil
	}
	return 0, fmt.Errorf("file: stat %s: %w", key.ID, store.ErrNotFound)
}

// Remove deletes a value's file and makes the deletion durable.
func (e *Engine) Remove(key store.Key) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	mu := e.stripeOf(key)
	mu.Lock()
	defer mu.Unlock()
	e.mu.Lock()
	ent := e.index[key]
	if ent == nil {
		e.mu.Unlock()
		return fmt.Errorf("file: remove %s: %w", key.ID, store.ErrNotFound)
	}
	e.deleteLocked(ent, store.Removed)
	e.mu.Unlock()
	p := e.path(key)
	if err := e.fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		e.nIO.Add(1)
		return fmt.Errorf("file: remove %s: %w", key.ID, ioErr(err))
	}
	if err := e.fs.SyncDir(filepath.Dir(p)); err != nil {
		e.nIO.Add(1)
		return fmt.Errorf("file: remove %s: sync dir: %w", key.ID, ioErr(err))
	}
	return nil
}

// Stats returns a snapshot of counters and gauges.
func (e *Engine) Stats() store.Stats {
	e.mu.Lock()
	objects, used := int64(len(e.index)), e.used
	e.mu.Unlock()
	return store.Stats{
		Engine: "file", Objects: objects, UsedBytes: used, CapacityBytes: e.cfg.CapacityBytes,
		Evictions: e.nEvictions.Load(), EvictedBytes: e.nEvictedBytes.Load(), CorruptReads: e.nCorrupt.Load(),
		ReadBytes: e.nReadBytes.Load(), WriteBytes: e.nWriteBytes.Load(), Reads: e.nReads.Load(),
		Writes: e.nWrites.Load(), IOErrors: e.nIO.Load(), Healthy: !e.closed.Load(),
	}
}

// Close waits for in-flight operations and releases the directory lock. Every
// acknowledged write is already durable, so there is nothing to flush.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	for e.inflight.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	if e.lock != nil {
		e.lock.Close()
		e.lock = nil
	}
	return nil
}

func ioErr(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", store.ErrCacheFull, err)
	}
	return fmt.Errorf("%w: %w", store.ErrIO, err)
}
