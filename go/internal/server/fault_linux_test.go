//go:build linux

package server_test

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/group"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/vfs"
)

// gauge returns the value of a single-series metric family in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no %s", name)
	return 0
}

// The production engine stack (group over slab) on a failing disk: the exported
// dfkv_store_io_errors_total and dfkv_store_healthy move, and health returns once the disk
// does. What /readyz and alerting see is what these metrics say.
func TestDiskFaultsMoveStoreMetrics(t *testing.T) {
	inj := vfs.NewInjector(vfs.Default)
	dir := t.TempDir()
	eng, err := group.OpenDirs(group.Options{Engine: "slab", Dirs: []string{filepath.Join(dir, "d0"), filepath.Join(dir, "d1")},
		CapacityBytes: 16 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Slab: slab.Config{ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20, BufferPoolBytes: 4 << 20, FS: inj}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	reg := prometheus.NewRegistry()
	server.NewMetrics(reg, eng)
	put := func(i int) error {
		k := store.Key{ID: identity.ObjectID{Hi: uint64(i) * 0x9e3779b97f4a7c15, Lo: uint64(i)}, Tenant: 1}
		return eng.Put(k, 5000, func(dst []byte) error { return nil })
	}
	if err := put(0); err != nil {
		t.Fatal(err)
	}
	if gauge(t, reg, "dfkv_store_healthy") != 1 || gauge(t, reg, "dfkv_store_io_errors_total") != 0 {
		t.Fatal("a fresh store is not healthy and error-free")
	}
	// Every table fsync fails: Puts fail, errors are counted, and the disk goes unhealthy.
	inj.Inject(vfs.Fault{Ops: vfs.OpSync, Path: "slots.tbl", Err: syscall.EIO})
	failed := 0
	for i := 1; i <= 8; i++ {
		if err := put(i); errors.Is(err, store.ErrIO) {
			failed++
		} else if err != nil {
			t.Fatalf("put %d: %v, want an I/O error", i, err)
		}
	}
	if failed == 0 {
		t.Fatal("no Put failed while every table sync fails")
	}
	if gauge(t, reg, "dfkv_store_io_errors_total") == 0 {
		t.Fatal("dfkv_store_io_errors_total did not move")
	}
	if gauge(t, reg, "dfkv_store_healthy") != 0 {
		t.Fatal("dfkv_store_healthy stayed 1 while nothing can be made durable")
	}
	inj.Reset()
	for i := 10; i < 18; i++ { // both disks see a successful sync again
		if err := put(i); err != nil {
			t.Fatalf("put %d after the disk recovered: %v", i, err)
		}
	}
	if gauge(t, reg, "dfkv_store_healthy") != 1 {
		t.Fatal("dfkv_store_healthy did not return to 1 after the disk recovered")
	}
}
