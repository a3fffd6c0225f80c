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

func TestRegDMABufError(t *testing.T) {
	for _, tc := range []struct {
		e           int
		unsupported bool
		errno       syscall.Errno
		text        string
	}{
		{-1, true, 0, "has no ibv_reg_dmabuf_mr"},
		{95, true, syscall.EOPNOTSUPP, "errno 95"},
		{int(syscall.ENOSYS), true, syscall.ENOSYS, "errno 38"},
		{int(syscall.EINVAL), false, syscall.EINVAL, "errno 22"},
		{int(syscall.EBADF), false, syscall.EBADF, "errno 9"},
		{0, false, 0, "no error reported"},
	} {
		err := regDMABufError(4096, tc.e)
		if errors.Is(err, verbs.ErrDMABufUnsupported) != tc.unsupported {
			t.Errorf("errno %d: %v: unsupported = %v, want %v", tc.e, err, !tc.unsupported, tc.unsupported)
		}
		if tc.errno != 0 && !errors.Is(err, tc.errno) {
			t.Errorf("errno %d: %v does not wrap %v", tc.e, err, tc.errno)
		}
		if !strings.Contains(err.Error(), tc.text) {
			t.Errorf("errno %d: %q lacks %q", tc.e, err, tc.text)
		}
	}
}
