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
	coalesce          bool
	coalesceTimeoutMS int
	quotaFile         string
	defaultQuota      cli.Size
	pprofAddr         string
}

func addTierFlags(fs *flag.FlagSet, o *tierOptions) {
	o.ramBytes = 1 << 30
	fs.BoolVar(&o.ramTier, "ram-tier", false, "serve hot values from a preallocated RAM arena in front of the disks")
	fs.Var(&o.ramBytes, "ram-tier-bytes", "RAM tier arena size (bytes; KiB/MiB/GiB suffixes), allocated once at start")
	fs.IntVar(&o.ramShards, "ram-tier-shards", ramtier.DefaultShards, "RAM tier shards (independently locked arena parts); 16 for arenas of 100 GiB and more")
	fs.StringVar(&o.ramPolicy, "ram-tier-policy", "write-through", "PUT policy with the RAM tier: write-through (keep warm) or write-around (disk only)")
	fs.IntVar(&o.ramWaitMS, "ram-tier-wait-ms", int(ramtier.DefaultWaitTimeout/time.Millisecond), "longest wait for pinned arena slots before a request goes around the tier")
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
			WaitTimeout: time.Duration(o.ramWaitMS) * time.Millisecond,
			Coalesce:    o.coalesce, CoalesceTimeout: time.Duration(o.coalesceTimeoutMS) * time.Millisecond,
			Logger: log,
		})
		if err != nil {
			return nil, err
		}
		e = t
	} else if o.coalesce {
		e = coalesce.Wrap(e, time.Duration(o.coalesceTimeoutMS)*time.Millisecond)
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
