package slab

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/directio"
	"github.com/dfkv/dfkv/go/internal/store"
)

// openDirect opens an extent file for O_DIRECT|O_DSYNC payload I/O (create: a new file,
// never an existing one).
func openDirect(path string, create bool) (int, error) {
	extra := 0
	if create {
		extra = unix.O_CREAT | unix.O_EXCL
	}
	return directio.Open(path, extra, 0o600)
}

// preallocate reserves size bytes for fd so that payload writes never hit ENOSPC.
func preallocate(fd int, size int64) error {
	err := unix.Fallocate(fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Some file systems lack fallocate; a sized file still works, without the guarantee.
		err = unix.Ftruncate(fd, size)
	}
	return err
}

// preadFull and pwriteFull are the shared positional primitives (EINTR and short
// transfers retried).
var (
	preadFull  = directio.ReadFull
	pwriteFull = directio.WriteFull
)

func fdatasync(fd int) error {
	_, err := retryEINTR(func() (int, error) { return 0, unix.Fdatasync(fd) })
	return err
}

// punchHole frees the table bytes of a released extent so that slots.tbl stays sparse.
func punchHole(fd int, off, size int64) error {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size)
}

// dataSegments returns the [start,end) ranges of fd that hold data, skipping holes. It
// falls back to one range over the whole file where SEEK_DATA is unsupported.
func dataSegments(fd int, size int64) [][2]int64 {
	var segs [][2]int64
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // no data after off
				return segs
			}
			return [][2]int64{{0, size}}
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return [][2]int64{{0, size}}
		}
		end = min(end, size)
		if end <= start {
			break
		}
		segs = append(segs, [2]int64{start, end})
		off = end
	}
	return segs
}

// lockDir takes an exclusive flock on dir/slab.lock; the lock dies with the process.
func lockFile(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, fmt.Errorf("%s is locked by another process", path)
		}
		return -1, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return fd, nil
}

// syncDir makes a rename or create in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// ioErr classifies a device error: ENOSPC/EDQUOT are a full cache, the rest are I/O errors.
func ioErr(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", store.ErrCacheFull, err)
	}
	return fmt.Errorf("%w: %w", store.ErrIO, err)
}
