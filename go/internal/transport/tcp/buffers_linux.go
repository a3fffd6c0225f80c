package tcp

import (
	"os"
	"strconv"
	"strings"
)

// fixedBuffers reads net.core.rmem_max and wmem_max.
func fixedBuffers() (read, write bool) {
	return fixBuffer(sysctlInt("/proc/sys/net/core/rmem_max")), fixBuffer(sysctlInt("/proc/sys/net/core/wmem_max"))
}

func sysctlInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return v
}
