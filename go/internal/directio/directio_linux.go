package directio

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Open opens path for O_DIRECT|O_DSYNC reads and writes: every write is durable (data and
// allocation metadata) when it returns. extra adds open flags, e.g. unix.O_CREAT|unix.O_EXCL.
func Open(path string, extra int, perm uint32) (int, error) {
	flags := unix.O_RDWR | unix.O_DIRECT | unix.O_DSYNC | unix.O_CLOEXEC | extra
	for {
		fd, err := unix.Open(path, flags, perm)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open O_DIRECT", Path: path, Err: err}
		}
		return fd, nil
	}
}

// ReadFull reads len(b) bytes at off, retrying short reads and EINTR.
func ReadFull(fd int, b []byte, off int64) error {
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

// WriteFull writes all of b at off, retrying short writes and EINTR.
func WriteFull(fd int, b []byte, off int64) error {
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
