//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/coalesce"
	"github.com/dfkv/dfkv/go/internal/store/quota"
	"github.com/dfkv/dfkv/go/internal/store/ramtier"
)

// tierOptions are the flags of the layers in front of the disk engine: RAM hot tier, read
// coalescing, tenant quotas, and the profiling listener.
type tierOptions struct {
	ramTier           bool
	ramBytes          cli.Size
	ramShards         int
	ramPolicy         string
	ramWaitMS         int
	flushThreads      int
	dirtyBytes        cli.Size
	dirtyWaitMS       int
	flushDeferMS      int
	drainTimeoutMS    int
	faultStallFlush   bool
	coalesce          bool
	coalesceTimeoutMS int
	quotaFile         string
	defaultQuota      cli.Size
	pprofAddr         string
	// tags, when set, wraps the engine below the quota layer (KV events' tag keeping).
	tags func(store.Engine) (store.Engine, error)
}

func addTierFlags(fs *flag.FlagSet, o *tierOptions) {
	o.ramBytes = 1 << 30
	fs.BoolVar(&o.ramTier, "ram-tier", false, "serve hot values from a preallocated RAM arena in front of the disks")
	fs.Var(&o.ramBytes, "ram-tier-bytes", "RAM tier arena size (bytes; KiB/MiB/GiB suffixes), allocated once at start")
	fs.IntVar(&o.ramShards, "ram-tier-shards", ramtier.DefaultShards, "RAM tier shards (independently locked arena parts); 16 for arenas of 100 GiB and more")
	fs.StringVar(&o.ramPolicy, "ram-tier-policy", "write-through", "PUT policy with the RAM tier: write-through (ack after the disk write; keep warm), write-around (disk only) or write-back (ack once in RAM; a crash loses unflushed writes)")
	fs.IntVar(&o.ramWaitMS, "ram-tier-wait-ms", int(ramtier.DefaultWaitTimeout/time.Millisecond), "longest wait for pinned arena slots before a request goes around the tier")
	fs.IntVar(&o.flushThreads, "ram-tier-flush-threads", ramtier.DefaultFlushThreads, "write-back: goroutines writing dirty arena slots to disk")
	fs.Var(&o.dirtyBytes, "ram-tier-dirty-bytes", "write-back: most arena bytes acknowledged but not yet on disk (default half the arena)")
	fs.IntVar(&o.dirtyWaitMS, "ram-tier-dirty-wait-ms", int(ramtier.DefaultDirtyWait/time.Millisecond), "write-back: longest PUT wait for dirty budget before it is refused (CacheFull)")
	fs.IntVar(&o.flushDeferMS, "ram-tier-flush-defer-ms", int(ramtier.DefaultFlushDefer/time.Millisecond), "write-back: while PUTs stream in and the dirty budget is under 15/16 full, longest a dirty value waits for its flush, so bursts are taken at receive speed (0: flush at once)")
	fs.IntVar(&o.drainTimeoutMS, "ram-tier-drain-timeout-ms", int(ramtier.DefaultDrainTimeout/time.Millisecond), "write-back: longest flush of dirty slots at shutdown (logged when hit; what is left is lost)")
	fs.BoolVar(&o.faultStallFlush, "fault-stall-flush", false, "fault injection for tests: write-back flushers write nothing until shutdown")
	fs.BoolVar(&o.coalesce, "read-coalesce", false, "concurrent identical GETs share one disk read")
	fs.IntVar(&o.coalesceTimeoutMS, "read-coalesce-timeout-ms", int(coalesce.DefaultTimeout/time.Millisecond), "a coalesced reader waits this long for its leader, then reads on its own")
	fs.StringVar(&o.quotaFile, "quota-file", "", "per-tenant byte quotas: lines of \"tenant-name bytes\" or \"0x<16 hex digits> bytes\" (see go/internal/store/quota)")
	fs.Var(&o.defaultQuota, "default-quota", "byte quota of tenants not in --quota-file (0 = unlimited)")
	fs.StringVar(&o.pprofAddr, "pprof-addr", "", "diagnostics: serve net/http/pprof on this host:port (off by default)")
}

// wrapEngine puts the optional layers in front of the disk engine: quota → RAM tier
// (which coalesces itself) or coalescing → engine. On error the engine is left open.
func wrapEngine(e store.Engine, o tierOptions, log *slog.Logger) (store.Engine, error) {
	if o.ramTier {
		pol, err := ramtier.ParsePolicy(o.ramPolicy)
		if err != nil {
			return nil, fmt.Errorf("--ram-tier-policy: %w", err)
		}
		if o.ramBytes <= 0 {
			return nil, errors.New("--ram-tier-bytes must be positive")
		}
		t, err := ramtier.New(e, ramtier.Config{
			ArenaBytes: int64(o.ramBytes), Shards: o.ramShards, Policy: pol,
			WaitTimeout:  time.Duration(o.ramWaitMS) * time.Millisecond,
			FlushThreads: o.flushThreads, DirtyBytes: int64(o.dirtyBytes),
			DirtyWait:    time.Duration(o.dirtyWaitMS) * time.Millisecond,
			DrainTimeout: time.Duration(o.drainTimeoutMS) * time.Millisecond,
			FlushDefer:   flushDefer(o.flushDeferMS),
			StallFlush:   o.faultStallFlush,
			Coalesce:     o.coalesce, CoalesceTimeout: time.Duration(o.coalesceTimeoutMS) * time.Millisecond,
			Logger: log,
		})
		if err != nil {
			return nil, err
		}
		e = t
	} else if o.coalesce {
		e = coalesce.Wrap(e, time.Duration(o.coalesceTimeoutMS)*time.Millisecond)
	}
	if o.tags != nil {
		t, err := o.tags(e)
		if err != nil {
			return nil, err
		}
		e = t
	}
	if o.quotaFile != "" || o.defaultQuota > 0 {
		l := quota.Limits{Default: -1}
		if o.quotaFile != "" {
			var err error
			if l, err = quota.ParseFile(o.quotaFile); err != nil {
				return nil, err
			}
		}
		if l.Default < 0 {
			l.Default = int64(o.defaultQuota)
		}
		q, err := quota.Wrap(e, l)
		if err != nil {
			return nil, err
		}
		log.Info("tenant quotas on", "listed_tenants", len(l.Tenants), "default_bytes", l.Default)
		e = q
	}
	if o.pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		go func() {
			srv := &http.Server{Addr: o.pprofAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			log.Warn("pprof listening (diagnostics)", "addr", o.pprofAddr)
			if err := srv.ListenAndServe(); err != nil {
				log.Error("pprof listener failed", "err", err)
			}
		}()
	}
	return e, nil
}

// flushDefer maps --ram-tier-flush-defer-ms to ramtier.Config.FlushDefer: 0 turns the
// deferral off (a negative Config value; zero there means the default).
func flushDefer(ms int) time.Duration {
	if ms <= 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}
