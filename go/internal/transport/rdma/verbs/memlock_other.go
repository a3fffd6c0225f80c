//go:build !linux

package verbs

// Memlock is unknown off Linux (no RDMA provider runs there): nothing is refused.
func Memlock() MemlockLimit { return MemlockLimit{} }
