package cabi

import (
	"os"
	"strings"
	"testing"
)

// Open takes DFKV_* from the process's live environment (LiveEnv, the C environ in the
// library), not the one Go started with: a variable set after start is used, one removed
// is gone.
func TestOpenSyncsLiveEnv(t *testing.T) {
	// The live environment: what the process has now, plus the host's changes. t.Setenv
	// restores every DFKV_* variable after the test (syncEnv rewrites Go's).
	var live []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "DFKV_") && !strings.HasPrefix(k, "DFKV_RDMA") {
			t.Setenv(k, v)
			live = append(live, kv)
		}
	}
	for _, k := range []string{"DFKV_RDMA", "DFKV_RDMA_PROVIDER", "DFKV_RDMA_DEV", "DFKV_RDMA_PRIMARY_DEV", "DFKV_RDMA_TIERS"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	n := len(live)
	live = append(live, "DFKV_RDMA=1", "DFKV_RDMA_PROVIDER=soft", "DFKV_RDMA_DEV=soft0,soft1", "PATH=/x", "DFKV_RDMA_PRIMARY_DEV=soft7")
	LiveEnv = func() []string { return live }
	defer func() { LiveEnv = nil }()
	o := good()
	if id := Open(&o); id != 0 {
		Close(id)
		t.Fatal("a primary outside the list, set only in the live environment, was not seen")
	}
	if !strings.Contains(LastError(), "soft7") {
		t.Fatalf("error %q does not name the live primary", LastError())
	}
	live = live[:n+4] // the host unset DFKV_RDMA_PRIMARY_DEV
	id := Open(&o)
	if id == 0 {
		t.Fatalf("refused after the bad variable was unset: %s", LastError())
	}
	Close(id)
	if _, ok := os.LookupEnv("DFKV_RDMA_PRIMARY_DEV"); ok {
		t.Fatal("a variable gone from the live environment lingers in Go's")
	}
	if os.Getenv("PATH") == "/x" {
		t.Fatal("a non-DFKV variable was synced")
	}
}
