//go:build unix && !linux

package ramtier

import "golang.org/x/sys/unix"

// mapArena maps n bytes of anonymous memory for an arena. Other Unix systems have no
// MAP_POPULATE or transparent-huge-page advice: the arena is faulted in on first use,
// which costs latency on the first writes, not correctness.
func mapArena(n int, _ bool) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

func unmapArena(b []byte) error { return unix.Munmap(b) }
