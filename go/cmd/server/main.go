//go:build linux

// Command dfkv_server is a dfkv cache node: it stores values on local disks (slab engine by
// default) and serves them over TCP. Every flag has a DFKV_* environment twin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/kvevents"
	"github.com/dfkv/dfkv/go/internal/metrics"
	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/tagged"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
	"github.com/dfkv/dfkv/go/internal/version"
	"github.com/dfkv/dfkv/go/internal/wire"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	dirs, host, engine, addrFile, logLevel string
	accessLog                              string
	port, metricsPort, maxConns            int
	accessLogSample                        int
	putWindow                              int
	capacity, maxMsg, extent               cli.Size
	firstReqMS, ioTimeoutMS, idleMS        int
	showVersion                            bool
	maxMsgAuto                             bool // --max-msg not given: derived from the capacity
	leaseShare                             float64
	tier                                   tierOptions
	mds                                    mdsFlags
	sec                                    cli.Security
	rdma                                   rdmaOptions
	events                                 eventOptions
	hot                                    hotOptions
}

func parse(args []string) (*options, error) {
	o := &options{capacity: 1 << 30, maxMsg: 64 << 20}
	fs := flag.NewFlagSet("dfkv_server", flag.ContinueOnError)
	fs.StringVar(&o.dirs, "dir", cli.DataDir("data"), "comma-separated data directories, one per disk")
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", 12000, "data-plane TCP port (0 picks a free one)")
	fs.Var(&o.capacity, "cap", "total capacity across all disks (bytes; KiB/MiB/GiB/TiB suffixes)")
	fs.StringVar(&o.engine, "store-engine", "slab", "storage engine: slab (default), file (diagnostic), mem (diagnostic, not persistent)")
	fs.Var(&o.extent, "extent-size", "slab extent file size (default 256MiB, smaller when the capacity needs it)")
	fs.IntVar(&o.metricsPort, "metrics-port", 0, "HTTP port for /metrics, /healthz, /readyz (0 = off)")
	fs.Var(&o.maxMsg, "max-msg", "largest value accepted (bytes; default 64MiB, or less for a slab cache too small to give every size class two extents)")
	fs.Float64Var(&o.leaseShare, "lease-share", store.DefaultLeaseShare, "share of --cap that leased lookups (BATCH_EXIST_LEASE) may protect from eviction at once; past it lookups answer without a lease (negative: no leases)")
	fs.IntVar(&o.maxConns, "max-conns", 4096, "open data connections allowed")
	fs.IntVar(&o.firstReqMS, "first-req-ms", 30000, "a new connection must send its first request within this")
	fs.IntVar(&o.ioTimeoutMS, "io-timeout-ms", 30000, "deadline for each payload read and reply write (re-armed once per eighth of it: may end up to an eighth early)")
	fs.IntVar(&o.putWindow, "put-window", server.DefaultPutWindow, "PUTs per connection whose disk write may be in flight while the connection reads the requests behind them (>= 1)")
	fs.IntVar(&o.idleMS, "idle-timeout-ms", 600000, "close data connections idle this long")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound data address (host:port) to this file once listening")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn, error")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.accessLog, "access-log", "", "write a JSON access log (one record per sampled request; key hashes, never keys) to FILE, or - for stdout")
	fs.IntVar(&o.accessLogSample, "access-log-sample", 1, "log 1 in N requests of each connection")
	addTierFlags(fs, &o.tier)
	addRDMAFlags(fs, &o.rdma)
	addEventFlags(fs, &o.events)
	addHotFlags(fs, &o.hot)
	o.mds.define(fs)
	o.sec.Define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dfkv_server [flags]\nEvery flag also reads DFKV_<FLAG> (e.g. --store-engine ↔ DFKV_STORE_ENGINE).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := cli.ApplyEnv(fs); err != nil {
		return nil, err
	}
	if err := o.mds.validate(); err != nil {
		return nil, err
	}
	if err := o.rdma.validate(); err != nil {
		return nil, err
	}
	if err := o.events.validate(); err != nil {
		return nil, err
	}
	if err := o.hot.validate(&o.mds, o.rdma.enable); err != nil {
		return nil, err
	}
	if o.accessLogSample < 1 {
		return nil, fmt.Errorf("--access-log-sample %d: want at least 1 (log 1 in N requests)", o.accessLogSample)
	}
	if o.putWindow < 1 || o.putWindow > 1024 {
		return nil, fmt.Errorf("--put-window %d: want 1..1024", o.putWindow)
	}
	if err := o.sec.Validate(); err != nil {
		return nil, err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "max-msg" })
	if !given && o.engine == "slab" && o.capacity > 0 {
		o.maxMsg, o.maxMsgAuto = cli.Size(autoMaxValue(int64(o.capacity)/int64(max(1, len(splitDirs(o.dirs)))))), true
	}
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if err != nil {
		return cli.ParseFailed("dfkv_server", err)
	}
	return cli.RunDaemon("dfkv_server", o.showVersion, o.logLevel, func(log *slog.Logger, stop *cli.Stop) error { return serve(o, log, stop) })
}

func serve(o *options, log *slog.Logger, stop *cli.Stop) error {
	limits := wire.DefaultLimits()
	limits.MaxValue = uint64(o.maxMsg)
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("--max-msg: %w", err)
	}
	dirs := splitDirs(o.dirs)
	if o.maxMsgAuto && o.maxMsg < 64<<20 {
		log.Info("--max-msg not given: largest value set to fit the capacity (raise --cap or set --max-msg)",
			"max_msg", int64(o.maxMsg), "cap", int64(o.capacity))
	}
	reg := cli.NewRegistry("dfkv_server_build_info", "Build and configuration of this node.", "engine", o.engine)
	var events *kvevents.Publisher
	if o.events.endpoint != "" && len(dirs) > 0 {
		pub, wrap, err := startEvents(o.events, eventNode(o.events, o.mds.advert, net.JoinHostPort(o.host, strconv.Itoa(o.port))), freshStart(o.engine, dirs), dirs[0], reg, log)
		if err != nil {
			return err
		}
		events = pub
		defer events.Close() // after the engine: its last removals are published
		o.tier.tags = wrap
	}
	engine, err := openEngine(engineConfig{
		kind: o.engine, dirs: dirs, capacity: int64(o.capacity), maxValue: int64(o.maxMsg), extent: int64(o.extent), leaseShare: o.leaseShare, log: log,
	})
	if err != nil {
		return err
	}
	if wrapped, err := wrapEngine(engine, o.tier, log); err != nil {
		_ = engine.Close()
		return err
	} else {
		engine = wrapped
	}
	closeEngine := func() {
		if err := engine.Close(); err != nil {
			log.Error("closing store", "err", err)
		}
	}

	sec, err := o.sec.Load(log)
	if err != nil {
		closeEngine()
		return err
	}
	sec.Start(o.sec.ReloadEvery)
	defer sec.Stop()

	m := server.NewMetrics(reg, engine)
	rdmaSrv, railMon, err := setupRDMA(o.rdma, engine, limits.MaxValue, reg, log)
	if err != nil {
		closeEngine()
		return err
	}
	var rdma server.RDMAServer
	if rdmaSrv != nil {
		rdma = rdmaSrv
		defer rdmaSrv.Close() // error paths; the drain below closes it before the engine
	}

	accessLog, closeAccessLog, err := openAccessLog(o.accessLog, o.accessLogSample)
	if err != nil {
		closeEngine()
		return err
	}
	defer closeAccessLog(log)

	srv, err := server.New(server.Config{
		RDMA:   rdma,
		Engine: engine, Limits: limits, MaxConns: o.maxConns,
		FirstRequestTimeout: time.Duration(o.firstReqMS) * time.Millisecond,
		IOTimeout:           time.Duration(o.ioTimeoutMS) * time.Millisecond,
		IdleTimeout:         time.Duration(o.idleMS) * time.Millisecond,
		PutWindow:           o.putWindow,
		SoftwareVersion:     version.Version, Logger: log, Metrics: m, AccessLog: accessLog, Auth: sec.Tokens,
		Tagger: tagger(engine),
	})
	if err != nil {
		closeEngine()
		return err
	}
	ln, err := tcp.Listen(net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		closeEngine()
		return err
	}
	if cfg := sec.ServerTLS(); cfg != nil {
		ln = secure.Listener(ln, cfg)
	}
	sec.WarnIfOpen(log, o.host)
	var nodeReg nodeRegistration
	ready := func() error {
		if !engine.Stats().Healthy {
			return errors.New("store unhealthy")
		}
		return nodeReg.ready()
	}
	// /readyz as a gauge, so "not ready" (store unhealthy, or not yet registered with the
	// MDS) can be graphed and alerted on.
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_server_ready",
		Help: "1 when /readyz answers 200 (store healthy and, with --mds, registered)."}, func() float64 {
		if ready() != nil {
			return 0
		}
		return 1
	}))
	httpSrv, err := cli.StartMetrics(o.host, o.metricsPort, metrics.HTTPConfig{Gatherer: reg, Ready: ready, Logger: log,
		TLS: sec.ServerTLS(), FirstRequestLimit: time.Duration(o.firstReqMS) * time.Millisecond})
	if err != nil {
		ln.Close()
		closeEngine()
		return err
	}
	addr := ln.Addr().String()
	stopHot := func() {}
	if o.hot.on {
		h, stop, err := startHot(o.hot, &o.mds, addr, engine, reg, log)
		if err != nil {
			ln.Close()
			closeEngine()
			return err
		}
		stopHot = stop // after the drain, before the engine closes
		srv.SetHot(h)
	}
	stop.Ready() // from here a stop signal is a clean stop (Wait below)
	if err := cli.WriteAddrFile(o.addrFile, addr); err != nil {
		ln.Close()
		closeEngine()
		return err
	}
	log.Info("dfkv_server listening", "addr", addr, "engine", o.engine, "dirs", strings.Join(dirs, ","),
		"cap", int64(o.capacity), "version", version.Version, "tls", sec.TLS != nil, "auth_tokens", sec.Tokens != nil)

	if events != nil {
		events.Start(eventNode(o.events, o.mds.advert, addr)) // the bound port, for a --port 0
		o.mds.extra = eventMemberConfig(events, o.events, o.mds.advert)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var railList []wire.Rail
	if railMon != nil {
		railList = railMon.Rails()
	}
	if err := nodeReg.start(&o.mds, addr, railList, log); err != nil {
		log.Error("mds registration", "err", err)
	}
	if railMon != nil {
		// A rail whose health moves re-publishes the member: topology_epoch moves.
		var ann railAnnouncer
		railMon.Start(func(rs []wire.Rail) {
			nodeReg.updateRails(rs)
			serveRecoveredRails(rdmaSrv, rs, log)
			ann.announce(rdmaSrv, rs, log)
		})
	}
	serveErr := stop.Wait(log, map[string]<-chan error{"listener": errc})
	if railMon != nil {
		railMon.Stop()
	}
	nodeReg.stop(log) // leave the ring first, so clients stop routing here
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("drain deadline passed; closed remaining connections", "err", err)
	}
	stopHot()
	if httpSrv != nil {
		_ = httpSrv.Close(ctx)
	}
	if rdmaSrv != nil {
		rdmaSrv.Close() // drops RAM tier pins and deregisters the arena before the engine closes
	}
	closeEngine()
	log.Info("stopped")
	if serveErr != nil && !errors.Is(serveErr, server.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// openAccessLog opens --access-log (nil when off); the returned func flushes and closes it.
func openAccessLog(path string, sample int) (*server.AccessLog, func(*slog.Logger), error) {
	if path == "" {
		return nil, func(*slog.Logger) {}, nil
	}
	var w *os.File
	if path == "-" {
		w = os.Stdout
	} else {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, fmt.Errorf("--access-log: %w", err)
		}
		w = f
	}
	a, err := server.NewAccessLog(w, sample)
	if err != nil {
		if w != os.Stdout {
			w.Close()
		}
		return nil, nil, fmt.Errorf("--access-log-sample: %w", err)
	}
	return a, func(log *slog.Logger) {
		if err := a.Close(); err != nil {
			log.Error("flushing the access log", "err", err)
		}
		if w != os.Stdout {
			if err := w.Close(); err != nil {
				log.Error("closing the access log", "err", err)
			}
		}
	}, nil
}

func splitDirs(list string) []string {
	var dirs []string
	for _, d := range strings.Split(list, ",") {
		if d = strings.TrimSpace(d); d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// tagger is the engine's tag keeper (KV events on), or nil.
func tagger(e store.Engine) server.Tagger {
	if t, ok := store.Find[*tagged.Engine](e); ok {
		return t
	}
	return nil
}
