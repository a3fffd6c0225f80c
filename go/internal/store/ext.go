package store

import (
	"errors"
	"fmt"
)

// Optional engine capabilities. Wrappers (group, ramtier, coalesce, quota) forward the ones
// their inner engines have; callers use the helpers below, which fall back to the plain
// Engine methods where a capability is missing.

// ErrBufferTooSmall: a caller buffer cannot hold the stored value (ReadInto). The stored
// length is returned alongside so the caller can retry or fall back.
var ErrBufferTooSmall = errors.New("store: buffer too small")

// ErrQuotaExceeded: the tenant is over its byte quota (quota wrapper). The server answers
// QuotaExceeded.
var ErrQuotaExceeded = errors.New("store: tenant quota exceeded")

// ErrBusy: the node cannot take the write now (a write-back RAM tier's dirty budget stayed
// full for the bounded wait); retrying later may succeed.
var ErrBusy = errors.New("store: busy")

// BlockSize is the O_DIRECT alignment: DirectReader and DirectWriter buffers start on a
// BlockSize boundary and are at least AlignUp(length) bytes long.
const BlockSize = 4096

// AlignUp rounds n up to a multiple of BlockSize.
func AlignUp(n int64) int64 { return (n + BlockSize - 1) &^ (BlockSize - 1) }

// DirectReader reads a whole value straight into a caller buffer (for disk engines: one
// O_DIRECT read into dst, no staging copy), verifying its checksum.
type DirectReader interface {
	// ReadInto reads the value of key into dst, which must be BlockSize-aligned and at least
	// AlignUp(length) bytes long (the padded tail is overwritten). It returns the value
	// length. When dst is too short it returns the stored length and ErrBufferTooSmall
	// without reading. A value that fails verification is ErrNotFound wrapping ErrCorrupt.
	ReadInto(key Key, dst []byte) (int, error)
}

// DirectWriter stores a value from a caller buffer without a staging copy.
type DirectWriter interface {
	// PutFrom stores src[:size]. src must be BlockSize-aligned and at least AlignUp(size)
	// bytes long; the engine may zero src[size:AlignUp(size)] (on-disk padding). Durable and
	// visible when it returns nil, like Put.
	PutFrom(key Key, src []byte, size int) error
}

// DirectItem is one value of a BatchWriter batch: Src[:Size], aligned as for PutFrom.
type DirectItem struct {
	Key  Key
	Src  []byte
	Size int
	// CRC is the CRC32C (Castagnoli) of Src[:Size] when HasCRC: the caller took it while
	// the bytes were still in cache (a write-back flush would otherwise reread a cold
	// megabyte for it). An engine that stores a checksum may use it instead of its own
	// pass; a wrong one makes the value fail its check on read (a miss, never wrong bytes).
	CRC    uint32
	HasCRC bool
}

// BatchWriter stores several values from caller buffers with one durability point: a disk
// engine writes every payload and record and then makes all the records durable together
// (one shared table fsync), where PutFrom pays one per value. Write-back flushers use it:
// no client waits on them, so they trade latency for fewer syncs.
type BatchWriter interface {
	// PutFromBatch stores each item as PutFrom would and sets errs[i] (len(errs) ==
	// len(items)) to item i's outcome. Keys must be distinct. Every item whose error is
	// nil is durable and visible when it returns.
	PutFromBatch(items []DirectItem, errs []error)
}

// PutFromBatch stores items through BatchWriter when e has it, else one by one.
func PutFromBatch(e Engine, items []DirectItem, errs []error) {
	if b, ok := e.(BatchWriter); ok {
		b.PutFromBatch(items, errs)
		return
	}
	for i, it := range items {
		errs[i] = PutFrom(e, it.Key, it.Src, it.Size)
	}
}

// RemovalReason says why a stored value left an engine.
type RemovalReason uint8

const (
	Replaced RemovalReason = iota // a Put of the same key replaced it
	Removed                       // Remove
	Evicted                       // capacity eviction
	Dropped                       // failed verification on read
)

func (r RemovalReason) String() string {
	switch r {
	case Replaced:
		return "replaced"
	case Removed:
		return "removed"
	case Evicted:
		return "evicted"
	case Dropped:
		return "dropped"
	}
	return "unknown"
}

// RemovalObserver is told about every value that leaves an engine after a successful Put
// made it visible: size is the value length in bytes. It may be called with engine locks
// held, so it must be quick, must not block and must not call back into the engine.
type RemovalObserver func(key Key, size int64, why RemovalReason)

// Observable engines report removals (overwrite, remove, eviction, drop) so that
// accounting layered above them (tenant quotas, RAM tiers) never drifts.
type Observable interface {
	// SetRemovalObserver installs fn (nil removes it); there is one observer per engine.
	SetRemovalObserver(fn RemovalObserver)
}

// Lister enumerates the stored values, e.g. to rebuild accounting after a restart.
type Lister interface {
	// ForEach calls fn for every stored value until fn returns false. It sees a consistent
	// view per internal shard only; concurrent writes may or may not be visited.
	ForEach(fn func(key Key, size int64) bool)
}

// Pinner lends RAM-resident values in place (RDMA GETs write straight from the arena).
type Pinner interface {
	// PinValue returns key's value in RAM, pinned until release is called (eviction and
	// overwrites cannot reuse its memory meanwhile), or ok=false when it is not in RAM.
	// release must be called exactly once; Close waits for it.
	PinValue(key Key) (value []byte, release func(), ok bool)
	// Arena is the memory every pinned value lies in, for registering it once.
	Arena() []byte
}

// Unwrapper is implemented by engines that wrap another one.
type Unwrapper interface {
	Unwrap() Engine
}

// Find returns the first engine in e's wrapper chain (e included) that implements T.
func Find[T any](e Engine) (T, bool) {
	for e != nil {
		if t, ok := e.(T); ok {
			return t, true
		}
		u, ok := e.(Unwrapper)
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	var zero T
	return zero, false
}

// ReadInto reads key's whole value into dst: through DirectReader when e has it, else by
// Get and one copy.
func ReadInto(e Engine, key Key, dst []byte) (int, error) {
	if d, ok := e.(DirectReader); ok {
		return d.ReadInto(key, dst)
	}
	n := 0
	err := e.Get(key, func(v []byte) error {
		n = len(v)
		if len(v) > len(dst) {
			return fmt.Errorf("value of %d bytes into %d: %w", len(v), len(dst), ErrBufferTooSmall)
		}
		copy(dst, v)
		return nil
	})
	return n, err
}

// PutFrom stores src[:size]: through DirectWriter when e has it, else by Put and one copy.
func PutFrom(e Engine, key Key, src []byte, size int) error {
	if d, ok := e.(DirectWriter); ok {
		return d.PutFrom(key, src, size)
	}
	return e.Put(key, size, func(dst []byte) error {
		copy(dst, src[:size])
		return nil
	})
}

// SetRemovalObserver installs fn on the first Observable engine of e's wrapper chain and
// reports whether there was one.
func SetRemovalObserver(e Engine, fn RemovalObserver) bool {
	if o, ok := Find[Observable](e); ok {
		o.SetRemovalObserver(fn)
		return true
	}
	return false
}

// Haser engines answer whether they hold a key without building an error for a miss:
// write-back asks it on every PUT, and most of those keys are new.
type Haser interface {
	// Has reports whether key has a value; err is set only when the engine cannot tell
	// (closed).
	Has(key Key) (bool, error)
}

// Has reports whether e holds key: through Haser when e itself has it (a wrapper may
// answer Stat differently from what it wraps), else by Stat.
func Has(e Engine, key Key) (bool, error) {
	if h, ok := e.(Haser); ok {
		return h.Has(key)
	}
	_, err := e.Stat(key)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return false, err
}

// Toucher engines keep a recency order for eviction. A tier that serves a value from its
// own copy (the RAM tier's warm hits) calls Touch so that the engine below does not
// evict a value precisely because it is hot: without it, the disk engine sees only the
// RAM tier's misses and treats the values that hit in RAM as never used.
type Toucher interface {
	// Touch records a use of key's value, as a read would; an absent key is ignored.
	Touch(key Key)
}

// Touch records a use of key on e when e keeps a recency order (a no-op otherwise).
func Touch(e Engine, key Key) {
	if t, ok := Find[Toucher](e); ok {
		t.Touch(key)
	}
}

// RAMStats are the counters and gauges of a RAM hot tier.
type RAMStats struct {
	ArenaBytes        int64 // arena size
	UsedBytes         int64 // bytes held by slots (live, reserved or waiting for reuse)
	LiveBytes         int64 // bytes of values servable from RAM
	Objects           int64 // values servable from RAM
	Pinned            int64 // slots pinned by in-flight I/O right now
	Backlog           int64 // slots being filled (disk read or socket read in flight)
	Hits              int64
	Misses            int64
	Promoted          int64 // values read from disk into the arena
	Evictions         int64
	EvictedBytes      int64
	BackpressureWaits int64 // allocations that had to wait for pinned slots to drain
	Bypassed          int64 // requests served around the tier (no room in time, too large)

	// Write-back (zero otherwise).
	WriteBack        bool
	FlushThreads     int64 // flusher goroutines
	DirtyBudgetBytes int64 // --ram-tier-dirty-bytes
	DirtyBytes       int64 // bytes of slots waiting for their flush (acknowledged, not on disk)
	FlushBacklog     int64 // slots waiting for a flusher
	Flushed          int64 // dirty slots written to disk
	FlushDeferrals   int64 // times a flusher held off for PUTs streaming in
	FlushDropped     int64 // dirty slots dropped unwritten (overwritten or removed first)
	FlushErrors      int64 // dirty slots whose disk write failed (their key reads as a miss)
	DirtyWaits       int64 // PUTs that waited for dirty budget
	DirtyBusy        int64 // PUTs refused with ErrBusy after the bounded wait
	Tombstones       int64 // overwrites that removed an older durable version before their ack
}

// RAMTier is implemented by RAM hot tiers.
type RAMTier interface {
	RAMStats() RAMStats
}

// CoalesceStats count read coalescing.
type CoalesceStats struct {
	Leaders   int64 // reads that went to the disk on behalf of a flight
	Coalesced int64 // reads served by another read's flight
	Timeouts  int64 // followers that gave up on a stalled leader and read on their own
}

// Coalescer is implemented by engines that coalesce concurrent identical reads.
type Coalescer interface {
	Coalescing() bool // coalescing is on
	CoalesceStats() CoalesceStats
}

// TenantUsage is one row of per-tenant quota accounting. Tenant is the label: the name
// (or hash) given in the quota file, or "other" for every tenant not listed there.
type TenantUsage struct {
	Tenant     string
	UsedBytes  int64
	LimitBytes int64 // 0 = unlimited
	Rejected   int64 // PUTs refused with QuotaExceeded
}

// QuotaReporter is implemented by quota-enforcing engines.
type QuotaReporter interface {
	TenantUsage() []TenantUsage
}
