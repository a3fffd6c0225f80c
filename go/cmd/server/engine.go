//go:build linux

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
// The size is then adjusted so that whole extents, and whole slots in them, tile the
// share: the remainder of share/extent is never used, and with 64 MiB extents that was up
// to half of a small cache (a 125 MB share held one 64 MiB extent).
const (
	extentsPerClass = 4
	maxAutoExtent   = 256 << 20
	// minSlabShare is the smallest disk share the slab engine is given: below it a node is
	// more likely misconfigured (a unit typo in --cap) than meant as a cache.
	minSlabShare = 4 << 20
)

// autoMaxValue is the largest value a slab disk of this share accepts when --max-msg is
// not given: 64 MiB, halved (down to 1 MiB) while the automatic geometry would give some
// size class fewer than two extents (the slab engine's "few extents" threshold). So the
// default 1 GiB cache starts clean with 8 MiB values, and from about 6.1 GiB per disk it
// takes 64 MiB values. A share too small for even 1 MiB values keeps 64 MiB: such a cache
// is refused (or warned about) exactly as before, not silently shrunk.
func autoMaxValue(share int64) int64 {
	const top = 64 << 20
	for mv := int64(top); mv >= 1<<20; mv /= 2 {
		if share >= mv && share/autoExtent(share, mv) >= 2*int64(len(slab.SizeClasses(mv))) {
			return mv
		}
	}
	return top
}

func autoExtent(share, maxValue int64) int64 {
	e := share / int64(extentsPerClass*len(slab.SizeClasses(maxValue)))
	e = min(e, maxAutoExtent)
	floor := (maxValue + 4095) &^ 4095
	e = max(e, floor)
	e &^= 4095
	if e <= 0 || share < e {
		return e
	}
	// Tile the share with whole extents, each a multiple of the quantum q so that every
	// power-of-two size class up to q fills an extent exactly: a 2,113,536-byte extent
	// holds 32 slots of 64 KiB and wastes 0.8% of the cache, a 2,228,224-byte one wastes
	// nothing. Among extent counts from the target down to half of it (never an extent
	// under the largest value or over the default), take the least waste; ties go to
	// more, smaller extents.
	q := int64(64 << 10)
	for q > 4096 && q > floor {
		q /= 2
	}
	target := (share + e - 1) / e
	best, bestWaste := e, share-(share/e)*e
	for n := target; n >= max(1, target/2); n-- {
		x := (share / n) &^ (q - 1)
		if x < floor {
			continue
		}
		if x > maxAutoExtent {
			break
		}
		if w := share - n*x; w < bestWaste {
			best, bestWaste = x, w
		}
		if bestWaste < q {
			break
		}
	}
	return best
}

// slabMaxValue is the slab engine's largest value for a disk's share: no value larger
// than the share can be cached, so a node with a --cap below --max-msg starts (with values
// up to its capacity) instead of refusing an extent larger than its disk share.
func slabMaxValue(share, maxMsg int64) int64 {
	if share >= maxMsg {
		return maxMsg
	}
	return max(share&^4095, 4096)
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
		share := c.capacity / int64(len(c.dirs))
		extent, maxValue := c.extent, c.maxValue
		if c.kind == "slab" && share < minSlabShare {
			return nil, fmt.Errorf("--cap %d gives each of the %d disks %d bytes; the slab engine needs at least %d per disk",
				c.capacity, len(c.dirs), share, int64(minSlabShare))
		}
		if c.kind == "slab" && extent == 0 {
			maxValue = slabMaxValue(share, c.maxValue)
			if maxValue < c.maxValue {
				c.log.Warn("slab: the disk share is smaller than --max-msg; larger values are refused",
					"share", share, "max_value", maxValue, "max_msg", c.maxValue)
			}
			extent = autoExtent(share, maxValue)
			// A formatted disk keeps its extent size: the automatic choice changed
			// between releases and a geometry change refuses to start.
			for _, dir := range c.dirs {
				if eb, _, ok, err := slab.Formatted(dir); err == nil && ok {
					extent = eb
					break
				}
			}
		}
		return group.OpenDirs(group.Options{
			Engine: c.kind, Dirs: c.dirs, CapacityBytes: c.capacity, Logger: c.log,
			Slab: slab.Config{ExtentBytes: extent, MaxValueBytes: maxValue, LeaseShare: c.leaseShare},
			File: file.Config{MaxValueBytes: c.maxValue},
		})
	default:
		return nil, fmt.Errorf("unknown --store-engine %q (want slab, file or mem)", c.kind)
	}
}
