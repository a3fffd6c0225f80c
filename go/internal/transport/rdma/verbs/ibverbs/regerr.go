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
