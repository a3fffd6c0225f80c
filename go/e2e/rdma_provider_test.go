package e2e

import (
	"os"
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// The provider the cross-process RDMA suites run over is a parameter, not a copy of each
// test: the in-tree soft NIC by default, the ibverbs provider on a real verbs stack with
// DFKV_TEST_RDMA_PROVIDER=ibverbs (the Soft-RoCE guest, tools/rdma-vm, sets it). The
// device: DFKV_TEST_RDMA_DEV, else the first with an ACTIVE port.
var (
	rdmaProvider = envOr("DFKV_TEST_RDMA_PROVIDER", "soft")
	rdmaDev      = os.Getenv("DFKV_TEST_RDMA_DEV")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// rdmaArgs is the server's RDMA flags for the provider under test, then extra.
func rdmaArgs(extra ...string) []string {
	a := []string{"--rdma", "--rdma-provider", rdmaProvider}
	if rdmaDev != "" {
		a = append(a, "--rdma-dev", rdmaDev)
	}
	return append(a, extra...)
}

// softOnly skips a test that injects faults through the soft NIC's own hooks (lost
// completions, per-rail latency): a real stack has no such hooks; its faults have their
// own tests (rdma_ibverbs_test.go).
func softOnly(t *testing.T) {
	t.Helper()
	if rdmaProvider != "soft" {
		t.Skipf("soft-NIC fault injection; provider under test is %s", rdmaProvider)
	}
}

// testVerbs opens the provider under test in this process (the client side of the
// one-sided tests).
func testVerbs(t *testing.T) verbs.Provider {
	t.Helper()
	switch rdmaProvider {
	case "soft":
		p, err := soft.New(soft.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	case "ibverbs":
		return ibverbs.New(ibverbs.Options{})
	}
	t.Fatalf("DFKV_TEST_RDMA_PROVIDER=%q: want soft or ibverbs", rdmaProvider)
	return nil
}
