package main

import (
	"fmt"
	"log/slog"

	"github.com/dfkv/dfkv/go/store"
)

type engineConfig struct {
	kind     string
	dirs     []string
	capacity int64
	maxValue int64
	extent   int64
	log      *slog.Logger
}

// openEngine opens the configured storage engine. Invalid geometry refuses to start rather
// than falling back to another engine.
func openEngine(c engineConfig) (store.Engine, error) {
	if c.capacity <= 0 {
		return nil, fmt.Errorf("--cap must be positive")
	}
	switch c.kind {
	case "mem":
		c.log.Warn("mem engine: values live in RAM only and are lost on restart (diagnostics/benchmarks)")
		return store.NewMem(c.capacity), nil
	default:
		return nil, fmt.Errorf("unknown --store-engine %q (want slab, file or mem)", c.kind)
	}
}
