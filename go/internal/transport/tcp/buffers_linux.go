package tcp

import "github.com/dfkv/dfkv/go/internal/sysfs"

// fixedBuffers reads net.core.rmem_max and wmem_max.
func fixedBuffers() (read, write bool) {
	return fixBuffer(sysMax("/proc/sys/net/core/rmem_max")), fixBuffer(sysMax("/proc/sys/net/core/wmem_max"))
}

// sysMax is the kernel's maximum in path, -1 when it cannot be read.
func sysMax(path string) int64 {
	v, err := sysfs.Int(path)
	if err != nil {
		return -1
	}
	return v
}
