package verbs

import (
	"errors"
	"fmt"
)

// ErrMemlock: the process's locked-memory limit (RLIMIT_MEMLOCK) cannot hold a
// registration. Registered memory is pinned and counts against it unless the process has
// CAP_IPC_LOCK.
var ErrMemlock = errors.New("verbs: memlock limit too small")

// MemlockLimit is the process's locked-memory budget as the kernel applies it to
// ibv_reg_mr.
type MemlockLimit struct {
	Cur        uint64 // soft limit in bytes (ulimit -l × 1024)
	Unlimited  bool   // RLIM_INFINITY
	CapIPCLock bool   // CAP_IPC_LOCK in the effective set: the limit does not apply
	Known      bool   // false where the limit could not be read (then nothing is refused)
}

// Holds reports whether need bytes of registrations fit.
func (l MemlockLimit) Holds(need uint64) bool {
	return !l.Known || l.Unlimited || l.CapIPCLock || need <= l.Cur
}

// Check returns nil when need bytes of what (e.g. "the receive segment (--rdma-segment)")
// fit, else one line wrapping ErrMemlock that names the limit and the size needed.
func (l MemlockLimit) Check(need uint64, what string) error {
	if l.Holds(need) {
		return nil
	}
	return fmt.Errorf("%w: RLIMIT_MEMLOCK is %s (ulimit -l %d) and %s needs %s pinned; raise it (ulimit -l unlimited, systemd LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK",
		ErrMemlock, sizeText(l.Cur), l.Cur/1024, what, sizeText(need))
}

// sizeText is a byte count for people: "64 KiB", "256 MiB", "1.5 GiB".
func sizeText(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, u := float64(n), 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if f == float64(uint64(f)) {
		return fmt.Sprintf("%d %s", uint64(f), units[u])
	}
	return fmt.Sprintf("%.1f %s", f, units[u])
}
