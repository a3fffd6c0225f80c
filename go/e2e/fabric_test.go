package e2e

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// fabricScale stretches the RDMA tests' I/O deadlines for a slow fabric (Soft-RoCE under
// emulation moved an 8 MiB GET across two rxe devices past a 5 s deadline once):
// DFKV_TEST_FABRIC_SCALE=N multiplies them by N (1..20). Each wait stays bounded, so a hang
// still fails, only later.
var fabricScale = func() int {
	v := os.Getenv("DFKV_TEST_FABRIC_SCALE")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 20 {
		panic(fmt.Sprintf("DFKV_TEST_FABRIC_SCALE=%q: want 1..20", v))
	}
	return n
}()

// fabricTimeout is d stretched by DFKV_TEST_FABRIC_SCALE.
func fabricTimeout(d time.Duration) time.Duration { return d * time.Duration(fabricScale) }
