package soft

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// mapDMABuf maps bytes [offset, offset+size) of fd shared (the mapping starts at the page
// below offset, as mmap requires) and returns them and the unmap.
func mapDMABuf(fd int, offset, size uint64) ([]byte, func(), error) {
	pg := uint64(os.Getpagesize())
	base := offset &^ (pg - 1)
	n := offset - base + size
	if n > uint64(^uint(0)>>1) {
		return nil, nil, fmt.Errorf("%w: dmabuf of %d bytes", verbs.ErrInvalid, size)
	}
	m, err := unix.Mmap(fd, int64(base), int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if err == unix.ENODEV || err == unix.EACCES || err == unix.EINVAL {
			return nil, nil, fmt.Errorf("%w: soft: mmap dmabuf fd %d (%d bytes at %d): %w", verbs.ErrDMABufUnsupported, fd, size, offset, err)
		}
		return nil, nil, fmt.Errorf("soft: mmap dmabuf fd %d (%d bytes at %d): %w", fd, size, offset, err)
	}
	return m[offset-base:], func() { _ = unix.Munmap(m) }, nil
}
