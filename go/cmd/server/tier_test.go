//go:build linux

package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/ramtier"
)

// The write-back flags and their DFKV_* twins reach the tier's configuration.
func TestWriteBackFlagsAndEnv(t *testing.T) {
	t.Setenv("DFKV_RAM_TIER_FLUSH_THREADS", "7")
	t.Setenv("DFKV_RAM_TIER_DIRTY_BYTES", "3MiB")
	o, err := parse([]string{"--ram-tier", "--ram-tier-bytes", "8MiB", "--ram-tier-policy", "write-back",
		"--ram-tier-dirty-wait-ms", "123", "--ram-tier-drain-timeout-ms", "4567"})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := wrapEngine(store.NewMem(0), o.tier, log)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr, ok := e.(*ramtier.Tier)
	if !ok {
		t.Fatalf("engine %T, want the RAM tier", e)
	}
	c := tr.Config()
	if c.Policy != ramtier.WriteBack || c.FlushThreads != 7 || c.DirtyBytes != 3<<20 ||
		c.DirtyWait.Milliseconds() != 123 || c.DrainTimeout.Milliseconds() != 4567 || c.StallFlush {
		t.Fatalf("config %+v", c)
	}
	if rs := tr.RAMStats(); !rs.WriteBack || rs.FlushThreads != 7 {
		t.Fatalf("stats %+v", rs)
	}
	o.tier.ramPolicy = "write-sometimes"
	if _, err := wrapEngine(store.NewMem(0), o.tier, log); err == nil || !strings.Contains(err.Error(), "--ram-tier-policy") {
		t.Fatalf("bad policy: %v", err)
	}
}
