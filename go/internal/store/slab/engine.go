//go:build linux

package slab

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

const (
	tableName  = "slots.tbl"
	lockName   = "slab.lock"
	extentsDir = "extents"
	numShards  = 64
	// reclaimWait bounds how long a Put waits for pinned slots to drain before it reports
	// ErrCacheFull.
	reclaimWait = 2 * time.Second
)

var (
	_ store.Engine       = (*Engine)(nil)
	_ store.DirectReader = (*Engine)(nil)
	_ store.DirectWriter = (*Engine)(nil)
	_ store.Observable   = (*Engine)(nil)
	_ store.Lister       = (*Engine)(nil)
	_ store.Toucher      = (*Engine)(nil)
	_ store.Leaser       = (*Engine)(nil)
	_ store.BatchWriter  = (*Engine)(nil)
)

// Engine is a slab engine over one directory. It is safe for concurrent use.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	classes  []class
	extents  []*extent
	maxSlots int64 // table stride per extent: ExtentBytes/4096 records
	high     int64 // watermarks in bytes
	low      int64
	epoch    uint32
	unclean  bool // the previous run did not stop cleanly

	fs      vfs.FS
	lock    io.Closer
	tbl     vfs.File
	tblSync *groupSync
	bufs    *bufPool

	shards [numShards]shard
	seq    atomic.Uint64 // record sequence numbers; highest wins at rebuild
	tick   atomic.Int64  // logical clock for extent recency

	// allocMu guards slot states, free lists, extent assignment, used bytes and the clock
	// hands. It is held only for in-memory work, never across disk I/O.
	allocMu   sync.Mutex
	pool      []*extent // unassigned extents
	used      int64
	objects   int64
	draining  int           // extents being emptied for reassignment
	releaseCh chan struct{} // closed (and replaced) on releases while waiters > 0
	waiters   int           // Puts waiting for a release
	handExt   int           // global CLOCK hand for watermark eviction
	handSlot  int

	leases    *store.Leases // eviction skips leased slots (slot.leased, extent.leases)
	observer  atomic.Pointer[store.RemovalObserver]
	closed    atomic.Bool
	inflight  atomic.Int64
	syncFails atomic.Int64 // consecutive table sync failures

	nEvictions, nEvictedBytes, nCorrupt           atomic.Int64
	nReadBytes, nWriteBytes, nReads, nWrites, nIO atomic.Int64
}

type shard struct {
	mu sync.RWMutex
	m  map[store.Key]*slot
}

// class is one slot size and the extents currently carved into it.
type class struct {
	size     int64
	extents  []*extent // assigned extents, draining ones included
	avail    []*extent // extents that may have free slots (checked when popped)
	pending  int       // dead slots waiting for their tombstone or readers
	reserved int       // slots held by in-flight Puts
	handExt  int       // CLOCK hand within the class
	handSlot int
}

type extent struct {
	idx        int
	f          vfs.File
	class      int // -1 while in the pool
	slotSize   int64
	slots      []slot
	free       []int32 // free slot indexes; empty while draining
	used       int     // slots not free (reserved, live, dead or quarantined)
	reserved   int     // slots held by in-flight Puts: such an extent is not drained
	inAvail    bool
	draining   bool
	stuck      bool // draining, but holds a quarantined slot so it will never empty
	pins       atomic.Int32
	leases     atomic.Int32 // leased slots: such an extent is not drained
	lastAccess atomic.Int64
}

// Slot states, guarded by allocMu.
const (
	slotFree = iota
	slotReserved
	slotLive
	slotDead        // out of the index; waits for a durable tombstone and zero pins
	slotQuarantined // tombstone could not be written: never reused until restart
)

type slot struct {
	ext    *extent
	idx    int32
	state  uint8
	length uint32
	crc    uint32
	seq    uint64
	key    store.Key

	pins     atomic.Int32
	leased   atomic.Bool   // holds a lease: eviction skips it
	ref      atomic.Uint32 // CLOCK reference count, 0..maxRef (see reference)
	tombDone atomic.Bool   // the tombstone of the current occupant is durable
	released atomic.Bool   // returned to the free list for the current occupancy
}

// Open opens (formatting if needed) the slab engine in cfg.Dir and rebuilds its index
// from slots.tbl. It refuses to start on invalid geometry or when the directory was
// formatted with a different geometry.
func Open(cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:       cfg,
		log:       cfg.Logger.With("engine", "slab", "dir", cfg.Dir),
		maxSlots:  cfg.ExtentBytes / blockSize,
		high:      int64(cfg.HighWatermark * float64(cfg.CapacityBytes)),
		low:       int64(cfg.LowWatermark * float64(cfg.CapacityBytes)),
		fs:        cfg.FS,
		releaseCh: make(chan struct{}),
	}
	e.leases = store.NewLeases(int64(max(cfg.LeaseShare, 0)*float64(cfg.CapacityBytes)), leaseChanged)
	for _, size := range sizeClasses(cfg.MaxValueBytes) {
		e.classes = append(e.classes, class{size: size})
	}
	for i := range e.shards {
		e.shards[i].m = make(map[store.Key]*slot)
	}
	if err := e.open(); err != nil {
		e.closeFiles()
		return nil, fmt.Errorf("slab: open %s: %w", cfg.Dir, err)
	}
	return e, nil
}

func (e *Engine) open() error {
	dir := e.cfg.Dir
	if err := e.fs.MkdirAll(filepath.Join(dir, extentsDir), 0o700); err != nil {
		return err
	}
	lock, err := e.fs.Lock(filepath.Join(dir, lockName))
	if err != nil {
		return err
	}
	e.lock = lock

	old, formatted, err := readMeta(e.fs, dir)
	if err != nil {
		return err
	}
	if formatted {
		e.adoptClasses(old.Classes)
	}
	want := e.geometry()
	if formatted {
		if d := geometryDiff(old, want); d != "" {
			return fmt.Errorf("existing data has a different geometry: %s; refusing to start "+
				"(reuse the original settings or point to an empty directory)", d)
		}
	} else if _, err := e.fs.Stat(filepath.Join(dir, tableName)); err == nil {
		return fmt.Errorf("%s exists without %s; refusing to format over unknown data", tableName, metaName)
	}
	e.unclean = formatted && !old.Clean
	e.epoch = old.Epoch + 1
	m := want
	m.Epoch, m.Clean = e.epoch, false
	// The marker goes down before anything else is touched: from here on a crash is
	// detected at the next Open.
	if err := writeMeta(e.fs, dir, m); err != nil {
		return fmt.Errorf("write %s: %w", metaName, err)
	}
	if n := e.cfg.extentCount(); n < 2*len(e.classes) {
		e.log.Warn("slab: few extents for the number of size classes; a varied value-size mix will "+
			"keep reassigning extents", "extents", n, "classes", len(e.classes))
	}
	if e.unclean {
		e.log.Warn("slab: previous run did not stop cleanly", "crashed_epoch", old.Epoch, "cold_start", e.cfg.ColdStartAfterCrash)
	}

	if err := e.openExtents(); err != nil {
		return err
	}
	tbl, err := e.fs.OpenFile(filepath.Join(dir, tableName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", tableName, err)
	}
	e.tbl = tbl
	e.tblSync = newGroupSync(tbl.Datasync)
	if e.unclean && e.cfg.ColdStartAfterCrash {
		if err := tbl.Truncate(0); err != nil {
			return fmt.Errorf("cold start: truncate %s: %w", tableName, err)
		}
	}
	if err := e.fs.SyncDir(dir); err != nil {
		return err
	}
	e.bufs = newBufPool(e.cfg.BufferPoolBytes)
	start := time.Now()
	rs, err := e.rebuild()
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", tableName, err)
	}
	e.log.Info("slab: opened", "epoch", e.epoch, "objects", e.objects, "used_bytes", e.used,
		"capacity_bytes", e.cfg.CapacityBytes, "records", rs.records, "bad_records", rs.bad,
		"stale_records", rs.stale, "rebuild", time.Since(start))
	return nil
}

func (e *Engine) openExtents() error {
	n := e.cfg.extentCount()
	e.extents = make([]*extent, n)
	for i := range n {
		path := filepath.Join(e.cfg.Dir, extentsDir, fmt.Sprintf("%06d", i))
		f, err := e.fs.OpenDirect(path, false)
		if errors.Is(err, os.ErrNotExist) {
			f, err = e.fs.OpenDirect(path, true)
		}
		if err != nil {
			if errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("%w (the file system does not support O_DIRECT)", err)
			}
			return err
		}
		ext := &extent{idx: i, f: f, class: -1}
		e.extents[i] = ext
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("stat extent %d: %w", i, err)
		}
		if st.Size < e.cfg.ExtentBytes || st.AllocatedBytes < e.cfg.ExtentBytes {
			if err := f.Allocate(e.cfg.ExtentBytes); err != nil {
				return fmt.Errorf("preallocate extent %d (%d bytes): %w", i, e.cfg.ExtentBytes, ioErr(err))
			}
		}
	}
	return e.fs.SyncDir(filepath.Join(e.cfg.Dir, extentsDir))
}

// adoptClasses keeps the size classes a directory was formatted with when they differ
// from today's series but are valid for the configured maximum value: records name their
// class by index, and an upgrade must not refuse to start over (or reinterpret) a cache
// formatted before the series changed.
func (e *Engine) adoptClasses(disk []int64) {
	cur := make([]int64, len(e.classes))
	for i, c := range e.classes {
		cur[i] = c.size
	}
	if slices.Equal(disk, cur) || !validClasses(disk, e.cfg.MaxValueBytes) {
		return // equal, or a real mismatch that geometryDiff reports
	}
	e.log.Info("slab: keeping the size classes the directory was formatted with", "classes", len(disk))
	e.classes = e.classes[:0]
	for _, size := range disk {
		e.classes = append(e.classes, class{size: size})
	}
}

// geometry is the superblock geometry of the open engine.
func (e *Engine) geometry() meta {
	m := geometryOf(e.cfg)
	m.Classes = make([]int64, len(e.classes))
	for i, c := range e.classes {
		m.Classes[i] = c.size
	}
	return m
}

// maxRef caps a slot's CLOCK reference count (a generalized CLOCK): each read adds one, each
// pass of the hand takes one, and the hand evicts at zero. A value read k times survives k
// sweeps (at most maxRef), so reuse counts, not only recency: on the FAST'25 trace three
// nodes of this cache went from 0.986/1.011/1.000x to 0.991/1.027/1.015x what one LRU of
// their total capacity hits at 1/32, 1/16 and 1/8 of the distinct blocks (simulated;
// BENCHMARKS.md has the live runs). A bit (maxRef 1) gave the first figures.
const maxRef = 3

// reference records one read of s for the CLOCK.
func (s *slot) reference() {
	for {
		r := s.ref.Load()
		if r >= maxRef || s.ref.CompareAndSwap(r, r+1) {
			return
		}
	}
}

// passed is the CLOCK hand passing s: it reports whether s was referenced, taking one
// reference away.
func (s *slot) passed() bool {
	for {
		r := s.ref.Load()
		if r == 0 {
			return false
		}
		if s.ref.CompareAndSwap(r, r-1) {
			return true
		}
	}
}

// Touch implements store.Toucher: it references the value for the CLOCK as a read does,
// for tiers above (RAM) that served the read from their own copy.
func (e *Engine) Touch(key store.Key) {
	sh := e.shardOf(key)
	sh.mu.RLock()
	if s := sh.m[key]; s != nil { // in the index, hence live: evictLocked unlists under sh.mu
		s.reference()
		s.ext.lastAccess.Store(e.tick.Add(1))
	}
	sh.mu.RUnlock()
}

// Close waits for in-flight operations, marks the directory clean and releases
// resources. It is safe to call more than once.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.allocMu.Lock()
	e.notifyLocked() // wake Puts waiting for space; they see closed
	e.allocMu.Unlock()
	for e.inflight.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	var errs []error
	if err := e.tbl.Datasync(); err != nil {
		errs = append(errs, fmt.Errorf("sync %s: %w", tableName, err))
	}
	if len(errs) == 0 {
		m := e.geometry()
		m.Epoch, m.Clean = e.epoch, true
		if err := writeMeta(e.fs, e.cfg.Dir, m); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", metaName, err))
		}
	}
	e.closeFiles()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("slab: close %s: %w", e.cfg.Dir, err)
	}
	return nil
}

// closeFiles releases descriptors and buffers without touching the clean marker.
func (e *Engine) closeFiles() {
	for _, ext := range e.extents {
		if ext != nil && ext.f != nil {
			ext.f.Close()
			ext.f = nil
		}
	}
	if e.tbl != nil {
		e.tbl.Close()
		e.tbl = nil
	}
	if e.lock != nil {
		e.lock.Close()
		e.lock = nil
	}
	if e.bufs != nil {
		e.bufs.close()
	}
}

// UncleanStart reports whether the previous run stopped without a clean Close.
func (e *Engine) UncleanStart() bool { return e.unclean }

// Config returns the effective configuration (defaults applied).
func (e *Engine) Config() Config { return e.cfg }

// Stats returns a snapshot of the engine's counters and gauges.
func (e *Engine) Stats() store.Stats {
	e.allocMu.Lock()
	used, objects := e.used, e.objects
	e.allocMu.Unlock()
	return store.Stats{
		Engine:        "slab",
		Objects:       objects,
		UsedBytes:     used,
		CapacityBytes: e.cfg.CapacityBytes,
		Evictions:     e.nEvictions.Load(),
		EvictedBytes:  e.nEvictedBytes.Load(),
		CorruptReads:  e.nCorrupt.Load(),
		ReadBytes:     e.nReadBytes.Load(),
		WriteBytes:    e.nWriteBytes.Load(),
		Reads:         e.nReads.Load(),
		Writes:        e.nWrites.Load(),
		IOErrors:      e.nIO.Load(),
		// Repeated table sync failures mean nothing can be made durable any more.
		Healthy: !e.closed.Load() && e.syncFails.Load() < 3,
	}
}

func (e *Engine) enter() error {
	e.inflight.Add(1)
	if e.closed.Load() {
		e.inflight.Add(-1)
		return fmt.Errorf("slab: %s: %w", e.cfg.Dir, store.ErrClosed)
	}
	return nil
}

func (e *Engine) leave() { e.inflight.Add(-1) }

func (e *Engine) shardOf(k store.Key) *shard {
	h := k.ID.Lo ^ k.ID.Hi ^ k.Tenant
	return &e.shards[(h^h>>29)%numShards]
}

// classFor returns the smallest class that holds size bytes.
func (e *Engine) classFor(size int) int {
	return sort.Search(len(e.classes), func(i int) bool { return e.classes[i].size >= int64(size) })
}

func (e *Engine) address(s *slot) uint64 {
	return uint64(int64(s.ext.idx)*e.maxSlots + int64(s.idx))
}

// notifyLocked wakes every Put waiting for a release.
func (e *Engine) notifyLocked() {
	if e.waiters == 0 {
		return
	}
	close(e.releaseCh)
	e.releaseCh = make(chan struct{})
}

// SetRemovalObserver implements store.Observable. The observer runs with the allocator
// lock held.
func (e *Engine) SetRemovalObserver(fn store.RemovalObserver) {
	if fn == nil {
		e.observer.Store(nil)
		return
	}
	e.observer.Store(&fn)
}

func (e *Engine) observeLocked(k store.Key, size int64, why store.RemovalReason) {
	e.leases.Release(k) // the leased value left; a lease never outlives it
	if fn := e.observer.Load(); fn != nil {
		(*fn)(k, size, why)
	}
}

// ForEach implements store.Lister.
func (e *Engine) ForEach(fn func(store.Key, int64) bool) {
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.RLock()
		for k, s := range sh.m {
			if !fn(k, int64(s.length)) {
				sh.mu.RUnlock()
				return
			}
		}
		sh.mu.RUnlock()
	}
}
