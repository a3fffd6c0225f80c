package main

import (
	"fmt"
	"log/slog"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/file"
	"github.com/dfkv/dfkv/go/internal/store/group"
	"github.com/dfkv/dfkv/go/internal/store/slab"
)

type engineConfig struct {
	kind     string
	dirs     []string
	capacity int64
	maxValue int64
	extent   int64
	// leaseShare is slab.Config.LeaseShare (0 = the default).
	leaseShare float64
	log        *slog.Logger
}

// Extent sizing when --extent-size is not given. An extent serves one size class at a time,
// so a disk needs a few extents per class for a mixed workload not to evict values while
// far under its capacity: aim for 4 extents per size class, but never below the largest
// value (a slot must fit in an extent) and never above the 256 MiB default. Small caches
// with a large --max-msg therefore get few extents; docs/DEPLOY notes to lower --max-msg.
const (
	extentsPerClass = 4
	maxAutoExtent   = 256 << 20
)

func autoExtent(share, maxValue int64) int64 {
	e := share / int64(extentsPerClass*len(slab.SizeClasses(maxValue)))
	e = min(e, maxAutoExtent)
	floor := (maxValue + 4095) &^ 4095
	e = max(e, floor)
	return e &^ 4095
}

// openEngine opens the configured storage engine. Invalid geometry refuses to start rather
// than falling back to another engine.
func openEngine(c engineConfig) (store.Engine, error) {
	if c.capacity <= 0 {
		return nil, fmt.Errorf("--cap must be positive")
	}
	if len(c.dirs) == 0 {
		return nil, fmt.Errorf("--dir: no data directory")
	}
	switch c.kind {
	case "mem":
		c.log.Warn("mem engine: values live in RAM only and are lost on restart (diagnostics/benchmarks)")
		return store.NewMem(c.capacity), nil
	case "slab", "file":
		if c.kind == "file" {
			c.log.Warn("file engine selected: one file per object, for diagnostics and rollback only")
		}
		extent := c.extent
		if extent == 0 {
			extent = autoExtent(c.capacity/int64(len(c.dirs)), c.maxValue)
		}
		return group.OpenDirs(group.Options{
			Engine: c.kind, Dirs: c.dirs, CapacityBytes: c.capacity, Logger: c.log,
			Slab: slab.Config{ExtentBytes: extent, MaxValueBytes: c.maxValue, LeaseShare: c.leaseShare},
			File: file.Config{MaxValueBytes: c.maxValue},
		})
	default:
		return nil, fmt.Errorf("unknown --store-engine %q (want slab, file or mem)", c.kind)
	}
}
