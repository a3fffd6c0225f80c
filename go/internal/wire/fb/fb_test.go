package fb_test

import (
	"os"
	"os/exec"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates the code from schema/*.fbs with the pinned flatc and
// fails on any difference. Building flatc the first time takes a couple of minutes, so
// -short skips it; CI runs tools/gen.sh --check explicitly as well.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: codegen staleness check needs the pinned flatc")
	}
	cmd := exec.Command("bash", "../../../../tools/gen.sh", "--check")
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("generated FlatBuffers code is stale or flatc failed: %v\n%s", err, out)
	}
}
