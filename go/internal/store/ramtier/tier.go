package ramtier

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/coalesce"
)

// Policy selects what a PUT does with the tier.
type Policy uint8

const (
	// WriteThrough stores the value on disk from its arena slot and keeps it warm.
	WriteThrough Policy = iota
	// WriteAround stores the value on disk only; reads promote it.
	WriteAround
	// WriteBack acknowledges a PUT once its bytes are in an arena slot; flusher goroutines
	// write dirty slots to disk later. A crash loses the unflushed writes (the keys read
	// as misses, never as older versions).
	WriteBack
)

func (p Policy) String() string {
	switch p {
	case WriteAround:
		return "write-around"
	case WriteBack:
		return "write-back"
	}
	return "write-through"
}

// ParsePolicy parses "write-through", "write-around" or "write-back".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "write-through", "through", "":
		return WriteThrough, nil
	case "write-around", "around":
		return WriteAround, nil
	case "write-back", "back":
		return WriteBack, nil
	}
	return 0, fmt.Errorf("unknown RAM tier policy %q (want write-through, write-around or write-back)", s)
}

// Defaults.
const (
	DefaultShards      = 8
	DefaultWaitTimeout = 100 * time.Millisecond
	// DefaultFlushThreads is the number of write-back flusher goroutines.
	DefaultFlushThreads = 8
	// DefaultDirtyWait bounds a write-back PUT's wait for dirty budget before Busy.
	DefaultDirtyWait = 200 * time.Millisecond
	// DefaultDrainTimeout bounds how long Close flushes dirty slots.
	DefaultDrainTimeout = 60 * time.Second
	// DefaultFlushDefer is how long write-back flushers hold off while PUTs stream in and
	// the dirty budget has room (see Config.FlushDefer).
	DefaultFlushDefer = 2 * time.Second
	maxAutoValue      = 64 << 20
	minShardBytes     = 1 << 20
	stripes           = 1 << 16 // a flush holds its batch's stripes across a disk write: PUTs rarely share one
)

// Config configures a Tier.
type Config struct {
	// ArenaBytes is the arena size (rounded down to a multiple of 4096 per shard).
	ArenaBytes int64
	// Shards is the number of independently locked arena shards (default 8).
	Shards int
	// Policy is the PUT policy (default write-through).
	Policy Policy
	// MaxValueBytes: larger values bypass the tier (default a quarter of a shard, at most
	// 64 MiB).
	MaxValueBytes int64
	// WaitTimeout bounds how long an allocation waits for pinned slots (default 100ms).
	WaitTimeout time.Duration
	// Coalesce makes concurrent misses of one key share one disk read.
	Coalesce bool
	// CoalesceTimeout bounds a follower's wait for its leader (default 500ms).
	CoalesceTimeout time.Duration
	// FlushThreads is the number of write-back flushers (default 8).
	FlushThreads int
	// DirtyBytes is the write-back dirty budget: arena bytes that may hold values not yet
	// on disk (default half the arena; at most the arena).
	DirtyBytes int64
	// DirtyWait bounds a write-back PUT's wait for dirty budget; then it fails with
	// store.ErrBusy (default 200ms).
	DirtyWait time.Duration
	// DrainTimeout bounds how long Close flushes dirty slots (default 60s); when it is
	// hit, the unflushed writes are lost and the count is logged.
	DrainTimeout time.Duration
	// FlushDefer: while write-back PUTs keep arriving (one in progress, or one ended
	// under 5ms ago) and the dirty bytes are under 15/16 of the budget (once there, until
	// they are back under 1/2, and never again for the same stream of PUTs), flushers
	// leave a dirty value unflushed for up to this long (default 2s; negative: flush at
	// once). A burst that fits the budget is then taken at receive speed and flushed in
	// the gap after it, instead of sharing the CPU (the flush's CRC pass) and memory
	// bandwidth with it; a stream that outgrows the budget keeps every flusher writing.
	// What a crash can lose stays bounded by the budget.
	FlushDefer time.Duration
	// StallFlush is fault injection for tests: flushers write nothing until Close starts
	// draining, so the dirty budget fills.
	StallFlush bool
	Logger     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Shards <= 0 {
		c.Shards = DefaultShards
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.CoalesceTimeout <= 0 {
		c.CoalesceTimeout = coalesce.DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.FlushThreads <= 0 {
		c.FlushThreads = DefaultFlushThreads
	}
	if c.DirtyBytes <= 0 || c.DirtyBytes > c.ArenaBytes {
		c.DirtyBytes = c.ArenaBytes / 2
	}
	if c.DirtyWait <= 0 {
		c.DirtyWait = DefaultDirtyWait
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.FlushDefer == 0 {
		c.FlushDefer = DefaultFlushDefer
	}
	if c.MaxValueBytes <= 0 && c.Shards > 0 {
		c.MaxValueBytes = min(c.ArenaBytes/int64(c.Shards)/4, maxAutoValue)
	}
	return c
}

// Slot states (guarded by the shard lock).
const (
	slotReserved uint8 = iota // being filled by its owner; not in the index
	slotLive                  // in the index; its value is durable on disk
	slotDead                  // out of the index; reclaimed at the tail once unpinned
	slotDirty                 // in the index (write-back); not yet on disk; never evicted
)

type slot struct {
	sh      *shard
	off     int64 // absolute arena offset
	n       int64 // slot bytes (padded)
	length  int   // value length
	key     store.Key
	ackedAt int64 // write-back: when the value was acknowledged (Unix ns)
	crc     uint32
	hasCRC  bool // write-back: crc is the value's CRC32C, taken on receive
	state   uint8
	pins    atomic.Int32
}

type shard struct {
	t     *Tier
	mu    sync.RWMutex
	base  int64 // arena offset of the shard
	size  int64
	index map[store.Key]*slot
	ring  []*slot // allocation order: ring[rhead] is the tail (oldest)
	rhead int
	rlen  int
	spare []*slot // recycled slot structs

	used, live, objects int64 // bytes held, bytes servable, values servable

	waiters atomic.Int32
	wake    chan struct{} // closed and replaced when a pin drops or a slot settles
}

type stripe struct {
	epoch  atomic.Uint64 // bumped by every write, remove and reported removal
	active atomic.Int32  // writes and removes in progress
	// disk orders, per key stripe, write-back's disk changes (flushes, removals of an
	// older durable version, writes around the tier) against index publication, so a
	// flush can never land after a newer version was acknowledged.
	disk sync.Mutex
}

// Tier is a RAM hot tier over a backing engine. It is safe for concurrent use.
type Tier struct {
	backing store.Engine
	cfg     Config
	log     *slog.Logger
	arena   []byte
	shards  []shard
	stripes [stripes]stripe
	flights *coalesce.Group // nil without coalescing
	leaser  store.Leaser    // the backing engine's leases; nil when it has none

	observer atomic.Pointer[store.RemovalObserver]
	closed   atomic.Bool
	inflight atomic.Int64

	hits, misses, promoted, evictions, evictedBytes atomic.Int64
	waits, bypassed, backlog                        atomic.Int64

	wb wbState // write-back only
}

var (
	_ store.Engine       = (*Tier)(nil)
	_ store.DirectReader = (*Tier)(nil)
	_ store.Observable   = (*Tier)(nil)
	_ store.Lister       = (*Tier)(nil)
	_ store.RAMTier      = (*Tier)(nil)
	_ store.Coalescer    = (*Tier)(nil)
	_ store.Leaser       = (*Tier)(nil)
	_ store.Pinner       = (*Tier)(nil)
)

// errNoRoom: no slot could be made in time; the request goes around the tier.
var errNoRoom = errors.New("ramtier: no room in time")

// New allocates the arena and returns a tier in front of backing. The tier owns backing:
// Close closes it.
func New(backing store.Engine, cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if backing == nil {
		return nil, errors.New("ramtier: no backing engine")
	}
	shardBytes := cfg.ArenaBytes / int64(cfg.Shards) &^ (store.BlockSize - 1)
	if shardBytes < minShardBytes {
		return nil, fmt.Errorf("ramtier: arena of %d bytes over %d shards leaves %d bytes per shard; need at least %d",
			cfg.ArenaBytes, cfg.Shards, shardBytes, minShardBytes)
	}
	if cfg.MaxValueBytes > shardBytes {
		cfg.MaxValueBytes = shardBytes
	}
	total := shardBytes * int64(cfg.Shards)
	arena, err := mapArena(int(total), true)
	if err != nil {
		return nil, fmt.Errorf("ramtier: allocate a %d-byte arena: %w", total, err)
	}
	t := &Tier{backing: backing, cfg: cfg, log: cfg.Logger.With("component", "ramtier"), arena: arena,
		shards: make([]shard, cfg.Shards)}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.t, sh.base, sh.size = t, int64(i)*shardBytes, shardBytes
		sh.index = make(map[store.Key]*slot)
		sh.ring = make([]*slot, shardBytes/store.BlockSize) // the most slots a shard can hold
		sh.wake = make(chan struct{})
	}
	if cfg.Coalesce {
		t.flights = coalesce.NewGroup(cfg.CoalesceTimeout)
	}
	if cfg.DirtyBytes > total {
		t.cfg.DirtyBytes = total
	}
	store.SetRemovalObserver(backing, t.backingRemoved)
	t.leaser, _ = store.Find[store.Leaser](backing)
	if cfg.Policy == WriteBack {
		t.startFlushers()
	}
	t.log.Info("ramtier: arena ready", "bytes", total, "shards", cfg.Shards, "policy", cfg.Policy.String(),
		"max_value", cfg.MaxValueBytes, "coalesce", cfg.Coalesce)
	if cfg.Policy == WriteBack {
		t.log.Info("ramtier: write-back: a crash loses at most the dirty budget (unflushed acknowledged writes)",
			"dirty_budget", t.cfg.DirtyBytes, "flush_threads", cfg.FlushThreads, "dirty_wait", cfg.DirtyWait,
			"drain_timeout", cfg.DrainTimeout, "flush_defer", max(cfg.FlushDefer, 0))
	}
	return t, nil
}

// Unwrap returns the backing engine.
func (t *Tier) Unwrap() store.Engine { return t.backing }

// Config returns the effective configuration.
func (t *Tier) Config() Config { return t.cfg }

func mix(k store.Key) uint64 {
	h := k.ID.Lo ^ k.ID.Hi*0x9e3779b97f4a7c15 ^ k.Tenant*0xbf58476d1ce4e5b9
	return h ^ h>>29
}

func (t *Tier) shardOf(k store.Key) *shard { return &t.shards[mix(k)%uint64(len(t.shards))] }

func (t *Tier) stripeOf(k store.Key) *stripe { return &t.stripes[(mix(k)>>20)%stripes] }

func (t *Tier) enter() error {
	t.inflight.Add(1)
	if t.closed.Load() {
		t.inflight.Add(-1)
		return fmt.Errorf("ramtier: %w", store.ErrClosed)
	}
	return nil
}

func (t *Tier) leave() { t.inflight.Add(-1) }

func (t *Tier) bytesOf(s *slot) []byte { return t.arena[s.off : s.off+s.n : s.off+s.n] }

// ---- reads ----

// Get serves a warm value from its arena slot (pinned for the callback) or promotes a cold
// one by reading the disk straight into a new slot.
func (t *Tier) Get(key store.Key, fn func([]byte) error) error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	if s := t.lookup(key); s != nil {
		t.hits.Add(1)
		defer t.unpin(s)
		// The disk engine's eviction must see this use, or it evicts (and so drops from
		// RAM) exactly the values that are hot enough never to reach it.
		store.Touch(t.backing, key)
		t.ReleaseLease(key) // served from RAM: the disk copy's lease is consumed
		return fn(t.arena[s.off : s.off+int64(s.length)])
	}
	t.misses.Add(1)
	if t.flights == nil {
		return t.miss(key, nil, fn)
	}
	f, leader := t.flights.Join(key)
	if leader {
		return t.miss(key, f, fn)
	}
	v, done, err, ok := f.Wait()
	if !ok {
		return t.miss(key, nil, fn) // the leader stalled: read on our own
	}
	if err != nil {
		return err
	}
	defer done()
	return fn(v)
}

// lookup pins and returns key's live slot, or nil.
func (t *Tier) lookup(key store.Key) *slot {
	sh := t.shardOf(key)
	sh.mu.RLock()
	s := sh.index[key]
	if s != nil {
		s.pins.Add(1) // under the shard lock: the tail cannot take it meanwhile
	}
	sh.mu.RUnlock()
	return s
}

// miss reads a cold value, promoting it when it fits. f, when not nil, is the coalescing
// flight this call leads: it is always published.
func (t *Tier) miss(key store.Key, f *coalesce.Flight, fn func([]byte) error) (err error) {
	if f != nil {
		defer func() {
			if err != nil {
				f.Fail(err) // no-op when already published
			}
		}()
	}
	size, err := t.backing.Stat(key)
	if err != nil {
		return err
	}
	if size > t.cfg.MaxValueBytes {
		t.bypassed.Add(1)
		return t.readAround(key, f, fn)
	}
	st := t.stripeOf(key)
	// A write of the key that has begun (epoch taken) may land after this read and publish
	// before it finishes: what the read sees then is older than the disk, so it promotes only
	// if no write was in flight when it started (writers count themselves active before they
	// take their epoch) and none began since.
	epoch := st.epoch.Load()
	quiet := st.active.Load() == 0
	sh := t.shardOf(key)
	s, err := sh.reserve(key, store.AlignUp(size))
	if err != nil {
		t.bypassed.Add(1)
		return t.readAround(key, f, fn)
	}
	n, err := store.ReadInto(t.backing, key, t.bytesOf(s))
	if err != nil {
		sh.abort(s)
		if errors.Is(err, store.ErrBufferTooSmall) { // rewritten with a larger value meanwhile
			return t.readAround(key, f, fn)
		}
		return err
	}
	s.length = n
	if sh.publish(s, func() bool { return quiet && st.epoch.Load() == epoch && st.active.Load() == 0 }) {
		t.promoted.Add(1)
	}
	defer t.unpin(s) // the owner's pin, dropped after our own callback
	if f != nil {
		val := t.arena[s.off : s.off+int64(n)]
		f.Publish(val, nil, func(k int) { s.pins.Add(int32(k)) }, func() { t.unpin(s) })
	}
	return fn(t.arena[s.off : s.off+int64(n)])
}

// readAround serves a value through the backing engine (lending its buffer to followers).
func (t *Tier) readAround(key store.Key, f *coalesce.Flight, fn func([]byte) error) error {
	if f == nil {
		return t.backing.Get(key, fn)
	}
	return t.backing.Get(key, func(v []byte) error {
		wait := f.Shared(v)
		err := fn(v)
		wait()
		return err
	})
}

// PinValue implements store.Pinner: a warm value stays pinned (and the tier open) until
// release.
func (t *Tier) PinValue(key store.Key) ([]byte, func(), bool) {
	if t.enter() != nil {
		return nil, nil, false
	}
	s := t.lookup(key)
	if s == nil {
		t.leave()
		return nil, nil, false
	}
	t.hits.Add(1)
	var once sync.Once
	return t.arena[s.off : s.off+int64(s.length) : s.off+int64(s.length)], func() {
		once.Do(func() {
			t.unpin(s)
			t.leave()
		})
	}, true
}

// Arena implements store.Pinner.
func (t *Tier) Arena() []byte { return t.arena }

// ReadInto implements store.DirectReader (from RAM when warm).
func (t *Tier) ReadInto(key store.Key, dst []byte) (int, error) {
	if err := t.enter(); err != nil {
		return 0, err
	}
	defer t.leave()
	if s := t.lookup(key); s != nil {
		defer t.unpin(s)
		if s.length > len(dst) {
			return s.length, store.ErrBufferTooSmall
		}
		t.hits.Add(1)
		store.Touch(t.backing, key)
		t.ReleaseLease(key)
		return copy(dst, t.arena[s.off:s.off+int64(s.length)]), nil
	}
	return store.ReadInto(t.backing, key, dst)
}

// Stat answers from RAM when the value is warm.
func (t *Tier) Stat(key store.Key) (int64, error) {
	if err := t.enter(); err != nil {
		return 0, err
	}
	defer t.leave()
	sh := t.shardOf(key)
	sh.mu.RLock()
	s := sh.index[key]
	var n int64 = -1
	if s != nil {
		n = int64(s.length)
	}
	sh.mu.RUnlock()
	if n >= 0 {
		return n, nil
	}
	return t.backing.Stat(key)
}

// ---- writes ----

// Put writes the value to disk (from its arena slot under write-through, where it stays
// warm once durable).
func (t *Tier) Put(key store.Key, size int, fill func([]byte) error) error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	st := t.stripeOf(key)
	st.active.Add(1) // before the epoch: see miss
	defer st.active.Add(-1)
	mine := st.epoch.Add(1)
	sh := t.shardOf(key)
	if t.cfg.Policy == WriteBack {
		return t.putBack(key, st, sh, size, fill)
	}
	if t.cfg.Policy == WriteAround || size <= 0 || int64(size) > t.cfg.MaxValueBytes {
		err := t.backing.Put(key, size, fill)
		sh.invalidate(key)
		return err
	}
	s, err := sh.reserve(key, store.AlignUp(int64(size)))
	if err != nil {
		t.bypassed.Add(1)
		err := t.backing.Put(key, size, fill)
		sh.invalidate(key)
		return err
	}
	defer t.unpin(s)
	buf := t.bytesOf(s)
	if err := fill(buf[:size]); err != nil {
		sh.abort(s)
		return err
	}
	if err := store.PutFrom(t.backing, key, buf, size); err != nil {
		sh.abort(s)
		sh.invalidate(key)
		return err
	}
	s.length = size
	if !sh.publish(s, func() bool { return st.epoch.Load() == mine && st.active.Load() == 1 }) {
		sh.invalidate(key) // another write of the key overlapped: let the disk decide
	}
	return nil
}

// Remove drops the RAM copy and removes the value from disk.
func (t *Tier) Remove(key store.Key) error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.leave()
	st := t.stripeOf(key)
	st.active.Add(1) // before the epoch: see miss
	defer st.active.Add(-1)
	st.epoch.Add(1)
	sh := t.shardOf(key)
	if t.cfg.Policy == WriteBack {
		st.disk.Lock() // a flush of the key must not land after the removal
		defer st.disk.Unlock()
	}
	dirty := sh.invalidate(key)
	err := t.backing.Remove(key)
	sh.invalidate(key)
	if dirty && errors.Is(err, store.ErrNotFound) {
		return nil // the value lived only in RAM
	}
	return err
}

// backingRemoved is the backing engine's removal observer: a value that left the disk
// must not be served from RAM, and an in-flight promotion of it must not publish.
func (t *Tier) backingRemoved(key store.Key, size int64, why store.RemovalReason) {
	if why != store.Replaced { // a replacement comes from a Put, which bumped the epoch
		t.stripeOf(key).epoch.Add(1)
	}
	t.shardOf(key).invalidateDurable(key)
	if fn := t.observer.Load(); fn != nil {
		(*fn)(key, size, why)
	}
}

// SetRemovalObserver implements store.Observable: fn sees the backing engine's removals
// (RAM evictions are not removals: the value stays on disk).
func (t *Tier) SetRemovalObserver(fn store.RemovalObserver) {
	if fn == nil {
		t.observer.Store(nil)
		return
	}
	t.observer.Store(&fn)
}

// ForEach implements store.Lister over the backing engine.
func (t *Tier) ForEach(fn func(store.Key, int64) bool) {
	if l, ok := store.Find[store.Lister](t.backing); ok {
		l.ForEach(fn)
	}
}

// ---- stats and lifecycle ----

// Stats returns the backing engine's stats (the authoritative store).
func (t *Tier) Stats() store.Stats { return t.backing.Stats() }

// RAMStats implements store.RAMTier.
func (t *Tier) RAMStats() store.RAMStats {
	s := store.RAMStats{
		ArenaBytes: int64(len(t.arena)), Hits: t.hits.Load(), Misses: t.misses.Load(),
		Promoted: t.promoted.Load(), Evictions: t.evictions.Load(), EvictedBytes: t.evictedBytes.Load(),
		BackpressureWaits: t.waits.Load(), Bypassed: t.bypassed.Load(), Backlog: t.backlog.Load(),
		DirtyBytes: t.wb.dirty.Load(), FlushBacklog: t.wb.queued.Load(),
		Flushed: t.wb.flushed.Load(), FlushDropped: t.wb.dropped.Load(), FlushErrors: t.wb.errors.Load(),
		DirtyWaits: t.wb.waits.Load(), DirtyBusy: t.wb.busy.Load(), Tombstones: t.wb.tombstones.Load(),
		FlushDeferrals: t.wb.deferrals.Load(),
	}
	if t.cfg.Policy == WriteBack {
		s.WriteBack, s.FlushThreads, s.DirtyBudgetBytes = true, int64(t.cfg.FlushThreads), t.cfg.DirtyBytes
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		s.UsedBytes += sh.used
		s.LiveBytes += sh.live
		s.Objects += sh.objects
		for j := 0; j < sh.rlen; j++ {
			if sh.ring[(sh.rhead+j)%len(sh.ring)].pins.Load() > 0 {
				s.Pinned++
			}
		}
		sh.mu.RUnlock()
	}
	return s
}

// Coalescing implements store.Coalescer.
func (t *Tier) Coalescing() bool { return t.flights != nil }

// CoalesceStats implements store.Coalescer (zero without coalescing).
func (t *Tier) CoalesceStats() store.CoalesceStats {
	if t.flights == nil {
		return store.CoalesceStats{}
	}
	return t.flights.Stats()
}

// Close waits for in-flight requests, closes the backing engine and frees the arena.
func (t *Tier) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	for t.inflight.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	drained := true
	if t.cfg.Policy == WriteBack {
		drained = t.drain()
	}
	err := t.backing.Close()
	if !drained {
		return err // a flusher may still read the arena: leave it mapped (the process is exiting)
	}
	if uerr := unmapArena(t.arena); uerr != nil && err == nil {
		err = fmt.Errorf("ramtier: unmap arena: %w", uerr)
	}
	return err
}

// ---- leases ----

// Lease leases key in the backing engine. The arena needs no lease of its own: it only
// ever holds values that are on disk, so dropping a RAM copy never loses one; what a lease
// must protect is the disk copy, against capacity eviction.
func (t *Tier) Lease(key store.Key, ttl time.Duration) (int64, bool, error) {
	if err := t.enter(); err != nil {
		return 0, false, err
	}
	defer t.leave()
	return store.Lease(t.backing, key, ttl)
}

// ReleaseLease ends key's lease in the backing engine.
func (t *Tier) ReleaseLease(key store.Key) {
	if t.leaser != nil {
		t.leaser.ReleaseLease(key)
	}
}

// LeaseStats reports the backing engine's lease table.
func (t *Tier) LeaseStats() store.LeaseStats {
	if t.leaser == nil {
		return store.LeaseStats{}
	}
	return t.leaser.LeaseStats()
}
