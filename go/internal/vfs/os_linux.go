package vfs

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/directio"
)

// Default is the operating system's file system.
var Default FS = osFS{}

type osFS struct{}

func (osFS) OpenDirect(path string, create bool) (File, error) {
	extra := 0
	if create {
		extra = unix.O_CREAT | unix.O_EXCL
	}
	fd, err := directio.Open(path, extra, 0o600)
	if err != nil {
		return nil, err
	}
	return newOSFile(os.NewFile(uintptr(fd), path)), nil
}

func (osFS) OpenFile(path string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return newOSFile(f), nil
}

func (osFS) CreateTemp(dir, pattern string) (File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return newOSFile(f), nil
}

func (osFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }
func (osFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }
func (osFS) Remove(path string) error                     { return os.Remove(path) }
func (osFS) Stat(path string) (os.FileInfo, error)        { return os.Stat(path) }
func (osFS) ReadFile(path string) ([]byte, error)         { return os.ReadFile(path) }
func (osFS) ReadDir(path string) ([]os.DirEntry, error)   { return os.ReadDir(path) }
func (osFS) SyncDir(dir string) error                     { return SyncDir(dir) }
func (osFS) Lock(path string) (io.Closer, error)          { return Lock(path) }

// SyncDir makes a create, rename or remove in dir durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Lock takes an exclusive flock on path (created if absent); the lock dies with the
// process, so a crashed owner never leaves it behind.
func Lock(path string) (io.Closer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is locked by another process", path)
		}
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return f, nil
}

// osFile is an *os.File plus the Linux calls the engines need. Positional transfers use
// the raw descriptor (directio's loops retry EINTR and short transfers) so that the hot
// path of O_DIRECT I/O does not go through the runtime poller.
type osFile struct {
	*os.File
	fd int
}

func newOSFile(f *os.File) *osFile { return &osFile{File: f, fd: int(f.Fd())} }

func (f *osFile) ReadAt(p []byte, off int64) (int, error) {
	if err := directio.ReadFull(f.fd, p, off); err != nil {
		return 0, &os.PathError{Op: "read", Path: f.Name(), Err: err}
	}
	return len(p), nil
}

func (f *osFile) WriteAt(p []byte, off int64) (int, error) {
	if err := directio.WriteFull(f.fd, p, off); err != nil {
		return 0, &os.PathError{Op: "write", Path: f.Name(), Err: err}
	}
	return len(p), nil
}

func (f *osFile) Datasync() error {
	for {
		err := unix.Fdatasync(f.fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
		}
		return nil
	}
}

func (f *osFile) Allocate(size int64) error {
	err := unix.Fallocate(f.fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		// Some file systems lack fallocate; a sized file still works, without the guarantee.
		err = unix.Ftruncate(f.fd, size)
	}
	if err != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
	}
	return nil
}

func (f *osFile) PunchHole(off, size int64) error {
	err := unix.Fallocate(f.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size)
	if err != nil {
		return &os.PathError{Op: "punch hole", Path: f.Name(), Err: err}
	}
	return nil
}

func (f *osFile) Stat() (FileStat, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return FileStat{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return FileStat{Size: st.Size, AllocatedBytes: st.Blocks * 512}, nil
}

func (f *osFile) DataSegments(size int64) [][2]int64 {
	var segs [][2]int64
	for off := int64(0); off < size; {
		start, err := unix.Seek(f.fd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // no data after off
				return segs
			}
			return [][2]int64{{0, size}}
		}
		end, err := unix.Seek(f.fd, start, unix.SEEK_HOLE)
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
