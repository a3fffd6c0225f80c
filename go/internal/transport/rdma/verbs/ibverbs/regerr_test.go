package ibverbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

func TestRegMRError(t *testing.T) {
	small := verbs.MemlockLimit{Cur: 64 << 10, Known: true}
	cases := []struct {
		name    string
		n       int
		e       syscall.Errno
		l       verbs.MemlockLimit
		memlock bool
		want    string
	}{
		{"larger than the limit", 16 << 20, syscall.ENOMEM, small, true, "RLIMIT_MEMLOCK is 64 KiB (ulimit -l 64) and a 16777216-byte registration needs 16 MiB pinned"},
		{"the limit reached by earlier registrations", 4096, syscall.ENOMEM, small, true, "with the memory registered already"},
		{"limit 0 is EPERM", 4096, syscall.EPERM, verbs.MemlockLimit{Known: true}, true, "RLIMIT_MEMLOCK is 0 B (ulimit -l 0)"},
		{"unlimited: not the limit", 4096, syscall.ENOMEM, verbs.MemlockLimit{Unlimited: true, Known: true}, false, "reg_mr 4096 bytes: cannot allocate memory"},
		{"CAP_IPC_LOCK: not the limit", 4096, syscall.ENOMEM, verbs.MemlockLimit{Cur: 1, CapIPCLock: true, Known: true}, false, "cannot allocate memory"},
		{"another errno", 4096, syscall.EFAULT, small, false, "bad address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := regMRError(tc.n, tc.e, tc.l)
			if errors.Is(err, verbs.ErrMemlock) != tc.memlock || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v (memlock %v), want %q", err, errors.Is(err, verbs.ErrMemlock), tc.want)
			}
		})
	}
}
