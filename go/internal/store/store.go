package store

import (
	"errors"

	"github.com/dfkv/dfkv/go/identity"
)

// Sentinel errors. Engines wrap them with context; callers test with errors.Is.
var (
	// ErrNotFound: the value is absent (never stored, removed, evicted, or unreadable).
	ErrNotFound = errors.New("store: not found")
	// ErrCacheFull: no space could be made for the value right now.
	ErrCacheFull = errors.New("store: cache full")
	// ErrTooLarge: the value exceeds the engine's largest size class or the configured max.
	ErrTooLarge = errors.New("store: value too large")
	// ErrInvalid: a malformed request (zero length, bad range...).
	ErrInvalid = errors.New("store: invalid argument")
	// ErrCorrupt: stored bytes failed verification. Servers answer NotFound and count it.
	ErrCorrupt = errors.New("store: corrupt value")
	// ErrIO: the device failed.
	ErrIO = errors.New("store: I/O error")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("store: closed")
)

// Key names one stored value.
type Key struct {
	ID     identity.ObjectID
	Tenant uint64
}

// Engine stores opaque values by key. Implementations are safe for concurrent use.
//
// Values move without intermediate copies: Put hands the engine's own (for disk engines,
// aligned) buffer to fill, and Get hands the verified value to fn. Buffers passed to
// callbacks are valid only during the call.
type Engine interface {
	// Put stores a value of size bytes. fill is called exactly once with a size-byte buffer
	// that it must fill completely (typically straight from a socket); an error from fill
	// aborts the Put and is returned unwrapped. The value is durable and visible when Put
	// returns nil; a concurrent Put of the same key is last-writer-wins.
	Put(key Key, size int, fill func(dst []byte) error) error

	// Get calls fn with the whole stored value after verifying its checksum. A value that
	// fails verification is reported as ErrNotFound wrapping ErrCorrupt and is dropped.
	Get(key Key, fn func(value []byte) error) error

	// Stat returns the stored length of a value, or ErrNotFound.
	Stat(key Key) (int64, error)

	// Remove deletes a value; removing an absent key returns ErrNotFound.
	Remove(key Key) error

	// Stats returns a point-in-time snapshot of counters and gauges.
	Stats() Stats

	// Close flushes state and releases resources. It is safe to call more than once.
	Close() error
}

// Stats are engine counters and gauges. Engines fill what applies to them.
type Stats struct {
	Engine        string
	Objects       int64
	UsedBytes     int64 // bytes charged against capacity (slot sizes for slab)
	CapacityBytes int64
	Evictions     int64
	EvictedBytes  int64
	CorruptReads  int64
	ReadBytes     int64 // payload bytes read from the device
	WriteBytes    int64 // payload bytes written to the device
	Reads         int64 // device reads
	Writes        int64 // device writes
	IOErrors      int64
	Healthy       bool
}

// Add accumulates o into s (for multi-disk groups).
func (s *Stats) Add(o Stats) {
	s.Objects += o.Objects
	s.UsedBytes += o.UsedBytes
	s.CapacityBytes += o.CapacityBytes
	s.Evictions += o.Evictions
	s.EvictedBytes += o.EvictedBytes
	s.CorruptReads += o.CorruptReads
	s.ReadBytes += o.ReadBytes
	s.WriteBytes += o.WriteBytes
	s.Reads += o.Reads
	s.Writes += o.Writes
	s.IOErrors += o.IOErrors
}
