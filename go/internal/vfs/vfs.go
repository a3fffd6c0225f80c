//go:build linux

package vfs

import (
	"io"
	"os"
)

// FS is the file-system surface the disk engines use.
type FS interface {
	// OpenDirect opens path for O_DIRECT|O_DSYNC reads and writes (buffers and offsets
	// 4096-aligned); create makes a new file and fails if one exists.
	OpenDirect(path string, create bool) (File, error)
	// OpenFile is os.OpenFile: buffered I/O.
	OpenFile(path string, flag int, perm os.FileMode) (File, error)
	// CreateTemp is os.CreateTemp.
	CreateTemp(dir, pattern string) (File, error)
	MkdirAll(path string, perm os.FileMode) error
	Rename(oldpath, newpath string) error
	Remove(path string) error
	Stat(path string) (os.FileInfo, error)
	ReadFile(path string) ([]byte, error)
	ReadDir(path string) ([]os.DirEntry, error)
	// SyncDir makes a create, rename or remove in dir durable.
	SyncDir(dir string) error
	// Lock takes an exclusive, non-blocking lock on path (created if absent) that lasts
	// until Close or the death of the process.
	Lock(path string) (io.Closer, error)
}

// File is an open file. ReadAt and WriteAt transfer all of p or return an error
// (io.ErrUnexpectedEOF for a read past the end).
type File interface {
	io.Reader
	io.Writer
	io.Closer
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Sync flushes data and metadata (fsync); Datasync flushes data and the metadata
	// needed to read it back (fdatasync).
	Sync() error
	Datasync() error
	// Allocate reserves [0, size) so that later writes inside it cannot fail with ENOSPC
	// (where the file system cannot, it extends the file to size without the guarantee).
	Allocate(size int64) error
	// PunchHole frees [off, off+size) keeping the file size.
	PunchHole(off, size int64) error
	Truncate(size int64) error
	Stat() (FileStat, error)
	// DataSegments returns the [start, end) ranges below size that hold data, skipping
	// holes; one range over [0, size) where holes cannot be found.
	DataSegments(size int64) [][2]int64
	Name() string
}

// FileStat is what the engines need from fstat.
type FileStat struct {
	Size           int64
	AllocatedBytes int64
}
