package slab

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/dfkv/dfkv/go/internal/store"
)

// Defaults applied by Config.withDefaults.
const (
	DefaultExtentBytes     = 256 << 20
	DefaultMaxValueBytes   = 64 << 20
	DefaultHighWatermark   = 0.95
	DefaultLowWatermark    = 0.90
	DefaultBufferPoolBytes = 256 << 20

	// blockSize is the O_DIRECT alignment and the smallest size class.
	blockSize = 4096
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
	// the used bytes above High, values are evicted until they are at most Low.
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
// class is the previous one grown by a quarter and rounded up to 4 KiB (4, 8, 12, 16, 20,
// 28, 36 KiB, ...), so a value wastes at most ~25% of its slot; the series stops at the
// first class >= maxValue, which is capped to maxValue rounded up to 4 KiB. Deterministic:
// it is part of the persisted geometry.
func SizeClasses(maxValue int64) []int64 {
	top := alignUp(max(maxValue, 1))
	classes := []int64{blockSize}
	for c := int64(blockSize); c < top; {
		c = min(alignUp(c+c/4), top)
		classes = append(classes, c)
	}
	return classes
}

func alignUp(n int64) int64 { return (n + blockSize - 1) &^ (blockSize - 1) }
