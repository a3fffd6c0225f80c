//go:build linux

package slab

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// Defaults applied by Config.withDefaults.
const (
	DefaultExtentBytes   = 256 << 20
	DefaultMaxValueBytes = 64 << 20
	// The watermarks default to evicting on demand: the allocator already frees one slot
	// per Put when its class is full (CLOCK), and holding 5-10% of the cache empty cost
	// hits on a real trace (docs/BENCHMARKS.md, hit rate) for nothing in return.
	DefaultHighWatermark   = 1.0
	DefaultLowWatermark    = 0.99
	DefaultBufferPoolBytes = 256 << 20

	// blockSize is the O_DIRECT alignment and the smallest size class.
	blockSize = store.BlockSize
	// maxValueLimit keeps lengths within the record's u32 length field.
	maxValueLimit = 1 << 30
)

// Config describes one slab engine (one disk directory).
type Config struct {
	// Dir is the directory holding the engine's files; created if missing.
	Dir string
	// CapacityBytes is the disk space the engine may use; it is carved into
	// CapacityBytes/ExtentBytes extents (the remainder is unused).
	CapacityBytes int64
	// ExtentBytes is the size of one extent file (default 256 MiB); a multiple of 4096.
	ExtentBytes int64
	// MaxValueBytes is the largest storable value (default 64 MiB); at most ExtentBytes.
	MaxValueBytes int64
	// HighWatermark and LowWatermark are fractions of CapacityBytes: when a Put would take
	// the used bytes above High, values are evicted until they are at most Low. High = 1
	// (the default) turns this pass off: a second CLOCK hand sweeping every class clears
	// the reference bits the per-class hands rely on, and keeping room free costs hits.
	HighWatermark float64
	LowWatermark  float64
	// BufferPoolBytes bounds the idle aligned I/O buffers kept for reuse (default 256 MiB).
	BufferPoolBytes int64
	// LeaseShare is the share of CapacityBytes that leased values (store.Leaser) may hold
	// at once (default store.DefaultLeaseShare; negative: no leases are granted).
	LeaseShare float64
	// ColdStartAfterCrash discards every record at Open when the previous run did not stop
	// cleanly. Off by default: the write ordering already keeps records trustworthy.
	ColdStartAfterCrash bool
	// Logger receives lifecycle and error messages; nil means slog.Default().
	Logger *slog.Logger
	// FS is the file system under the engine; nil means vfs.Default. Tests put a
	// vfs.Injector here to fail reads, writes and syncs.
	FS vfs.FS
}

func (c Config) withDefaults() Config {
	if c.ExtentBytes == 0 {
		c.ExtentBytes = DefaultExtentBytes
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = min(int64(DefaultMaxValueBytes), c.ExtentBytes)
	}
	if c.HighWatermark == 0 && c.LowWatermark == 0 {
		c.HighWatermark, c.LowWatermark = DefaultHighWatermark, DefaultLowWatermark
	}
	if c.BufferPoolBytes == 0 {
		c.BufferPoolBytes = DefaultBufferPoolBytes
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.LeaseShare == 0 {
		c.LeaseShare = store.DefaultLeaseShare
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first problem with the configuration (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Dir == "" {
		bad("dir is empty")
	}
	if c.ExtentBytes <= 0 || c.ExtentBytes%blockSize != 0 {
		bad("extent size %d is not a positive multiple of %d", c.ExtentBytes, blockSize)
	}
	if c.CapacityBytes < c.ExtentBytes {
		bad("capacity %d is smaller than one extent (%d)", c.CapacityBytes, c.ExtentBytes)
	}
	if c.MaxValueBytes <= 0 {
		bad("max value size %d is not positive", c.MaxValueBytes)
	} else if c.MaxValueBytes > c.ExtentBytes {
		bad("max value size %d is larger than an extent (%d)", c.MaxValueBytes, c.ExtentBytes)
	} else if c.MaxValueBytes > maxValueLimit {
		bad("max value size %d exceeds %d", c.MaxValueBytes, maxValueLimit)
	}
	if !(c.LowWatermark > 0 && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1) {
		bad("watermarks low=%v high=%v: need 0 < low < high <= 1", c.LowWatermark, c.HighWatermark)
	}
	if c.LeaseShare > 0.9 {
		bad("lease share %v above 0.9 would leave eviction too little to work with", c.LeaseShare)
	}
	if c.BufferPoolBytes < 0 {
		bad("buffer pool size %d is negative", c.BufferPoolBytes)
	}
	if c.ExtentBytes > 0 && c.CapacityBytes/max(c.ExtentBytes, 1) > 1<<24 {
		bad("capacity %d needs more than %d extents; use larger extents", c.CapacityBytes, 1<<24)
	}
	if len(errs) > 0 {
		return fmt.Errorf("slab: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// extentCount is the number of extent files the capacity pays for.
func (c Config) extentCount() int { return int(c.CapacityBytes / c.ExtentBytes) }

// SizeClasses returns the slot sizes for a maximum value size: starting at 4 KiB, each
// class is the previous one grown by a quarter and rounded up to 4 KiB, except that the
// series never steps over a power of two (4, 8, 12, 16, 20, 28, 32, 40, 52, 64 KiB, ...):
// KV blocks are usually power-of-two sized and must fill their slots exactly (a 64 KiB
// block in a 76 KiB slot wasted 16% of the cache). A value wastes at most ~25% of its
// slot; the series stops at the first class >= maxValue, which is capped to maxValue
// rounded up to 4 KiB. Deterministic: it is part of the persisted geometry (directories
// formatted with an earlier series keep theirs, see adoptClasses).
func SizeClasses(maxValue int64) []int64 {
	top := alignUp(max(maxValue, 1))
	classes := []int64{blockSize}
	for c := int64(blockSize); c < top; {
		next := alignUp(c + c/4)
		if p := int64(1) << bits.Len64(uint64(c)); p < next { // the next power of two above c
			next = p
		}
		c = min(next, top)
		classes = append(classes, c)
	}
	return classes
}

// sizeClasses is the series a new directory is formatted with (a test replaces it to
// format a directory as an earlier release did).
var sizeClasses = SizeClasses

// validClasses reports whether classes is a usable series for maxValue: ascending
// multiples of 4 KiB from 4 KiB up to maxValue rounded up to 4 KiB, indexable by a
// record's u16 class field.
func validClasses(classes []int64, maxValue int64) bool {
	if len(classes) == 0 || len(classes) > 1<<16 || classes[0] != blockSize ||
		classes[len(classes)-1] != alignUp(max(maxValue, 1)) {
		return false
	}
	for i := 1; i < len(classes); i++ {
		if classes[i]%blockSize != 0 || classes[i] <= classes[i-1] {
			return false
		}
	}
	return true
}

func alignUp(n int64) int64 { return store.AlignUp(n) }
