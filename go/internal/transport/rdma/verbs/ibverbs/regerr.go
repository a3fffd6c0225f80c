package ibverbs

import (
	"fmt"
	"syscall"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// regMRError says why ibv_reg_mr of n bytes failed with errno e. The kernel pins the
// memory and refuses with ENOMEM once the process's pinned total would pass RLIMIT_MEMLOCK
// (EPERM when the limit is 0), unless the process has CAP_IPC_LOCK: then the error names
// the limit and the size, wrapping verbs.ErrMemlock.
func regMRError(n int, e syscall.Errno, l verbs.MemlockLimit) error {
	if (e == syscall.ENOMEM || e == syscall.EPERM) && l.Known && !l.Unlimited && !l.CapIPCLock {
		what := fmt.Sprintf("a %d-byte registration (with the memory registered already)", n)
		err := l.Check(l.Cur+1, what) // the limit was hit: say so even when n alone fits
		if uint64(n) > l.Cur {
			err = l.Check(uint64(n), fmt.Sprintf("a %d-byte registration", n))
		}
		return fmt.Errorf("ibverbs: reg_mr %d bytes: %w: %w", n, e, err)
	}
	msg := "no error reported"
	if e != 0 {
		msg = e.Error()
	}
	return fmt.Errorf("ibverbs: reg_mr %d bytes: %s", n, msg)
}

// regDMABufError says why ibv_reg_dmabuf_mr of n bytes failed with errno e (-1: the loaded
// libibverbs has no such entry point). A driver that cannot import DMA-BUFs (rxe, siw,
// older kernels) answers EOPNOTSUPP: that and the missing entry point wrap
// verbs.ErrDMABufUnsupported, and the errno is kept for errors.Is.
func regDMABufError(n uint64, e int) error {
	if e == -1 {
		return fmt.Errorf("ibverbs: reg_dmabuf_mr %d bytes: %w: libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)", n, verbs.ErrDMABufUnsupported)
	}
	errno := syscall.Errno(e)
	switch errno {
	case syscall.EOPNOTSUPP, syscall.EPROTONOSUPPORT, syscall.ENOSYS:
		return fmt.Errorf("ibverbs: reg_dmabuf_mr %d bytes: %w: errno %d: %w", n, verbs.ErrDMABufUnsupported, e, errno)
	case 0:
		return fmt.Errorf("ibverbs: reg_dmabuf_mr %d bytes: no error reported", n)
	}
	return fmt.Errorf("ibverbs: reg_dmabuf_mr %d bytes: errno %d: %w", n, e, errno)
}
