package slab

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/store"
)

// openDirect opens an extent file for O_DIRECT payload I/O. O_DSYNC makes every write
// durable (data and any allocation metadata) before pwrite returns.
func openDirect(path string, create bool) (int, error) {
	flags := unix.O_RDWR | unix.O_DIRECT | unix.O_DSYNC | unix.O_CLOEXEC
	if create {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	fd, err := retryEINTR(func() (int, error) { return unix.Open(path, flags, 0o600) })
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
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

// preadFull reads len(b) bytes at off, retrying short reads and EINTR.
func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// pwriteFull writes all of b at off, retrying short writes and EINTR.
func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

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
