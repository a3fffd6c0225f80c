package railset

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// getcpuNode is getcpu(2)'s node (x/sys/unix has the number, not a wrapper).
func getcpuNode() (int, error) {
	var cpu, node uint32
	if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0); e != 0 {
		return -1, e
	}
	return int(node), nil
}
