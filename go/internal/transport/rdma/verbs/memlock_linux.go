package verbs

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// capIPCLock is CAP_IPC_LOCK's bit in /proc/self/status CapEff.
const capIPCLock = 14

// Memlock reads this process's locked-memory limit and whether it has CAP_IPC_LOCK.
func Memlock() MemlockLimit {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return MemlockLimit{}
	}
	l := MemlockLimit{Cur: r.Cur, Unlimited: r.Cur == unix.RLIM_INFINITY, Known: true}
	// Capabilities are per thread: the calling thread's (the one about to register).
	f, err := os.Open("/proc/thread-self/status")
	if err != nil {
		f, err = os.Open("/proc/self/status")
	}
	if err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
				if caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil {
					l.CapIPCLock = caps&(1<<capIPCLock) != 0
				}
				break
			}
		}
	}
	return l
}
