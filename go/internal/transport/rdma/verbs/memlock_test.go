package verbs

import (
	"errors"
	"strings"
	"testing"
)

func TestMemlockCheck(t *testing.T) {
	seg := uint64(256 << 20)
	cases := []struct {
		name string
		l    MemlockLimit
		want string // "" = fits
	}{
		{"small limit", MemlockLimit{Cur: 64 << 10, Known: true}, "RLIMIT_MEMLOCK is 64 KiB (ulimit -l 64) and the receive segment (--rdma-segment) needs 256 MiB pinned"},
		{"8 MiB limit", MemlockLimit{Cur: 8 << 20, Known: true}, "RLIMIT_MEMLOCK is 8 MiB (ulimit -l 8192)"},
		{"exactly enough", MemlockLimit{Cur: seg, Known: true}, ""},
		{"unlimited", MemlockLimit{Cur: 1 << 63, Unlimited: true, Known: true}, ""},
		{"CAP_IPC_LOCK ignores the limit", MemlockLimit{Cur: 64 << 10, CapIPCLock: true, Known: true}, ""},
		{"unknown limit refuses nothing", MemlockLimit{}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Check(seg, "the receive segment (--rdma-segment)")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrMemlock) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line with %q", err, tc.want)
			}
		})
	}
	if s := sizeText(3 << 29); s != "1.5 GiB" {
		t.Fatalf("sizeText %q", s)
	}
}

// The running process's own limit reads back (the guest runs this under a small ulimit -l).
func TestMemlockOfThisProcess(t *testing.T) {
	l := Memlock()
	t.Logf("memlock: %+v", l)
	if l.Known && !l.Unlimited && !l.CapIPCLock && l.Holds(l.Cur+1) {
		t.Fatalf("a limit of %d holds %d", l.Cur, l.Cur+1)
	}
}
