package sysfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Int reads the decimal integer a kernel file such as /proc/sys/net/core/rmem_max holds.
func Int(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sysfs: %s: %w", path, err)
	}
	return v, nil
}
