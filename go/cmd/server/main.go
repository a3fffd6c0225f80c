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
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/metrics"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
	"github.com/dfkv/dfkv/go/internal/version"
	"github.com/dfkv/dfkv/go/internal/wire"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	dirs, host, engine, addrFile, logLevel string
	port, metricsPort, maxConns            int
	capacity, maxMsg, extent               cli.Size
	firstReqMS, ioTimeoutMS, idleMS        int
	showVersion                            bool
	tier                                   tierOptions
	mds                                    mdsFlags
	rdma                                   rdmaOptions
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "dfkv", "data")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "dfkv", "data")
	}
	return filepath.Join(os.TempDir(), "dfkv-data")
}

func parse(args []string) (*options, error) {
	o := &options{capacity: 1 << 30, maxMsg: 64 << 20}
	fs := flag.NewFlagSet("dfkv_server", flag.ContinueOnError)
	fs.StringVar(&o.dirs, "dir", defaultDataDir(), "comma-separated data directories, one per disk")
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", 12000, "data-plane TCP port (0 picks a free one)")
	fs.Var(&o.capacity, "cap", "total capacity across all disks (bytes; KiB/MiB/GiB/TiB suffixes)")
	fs.StringVar(&o.engine, "store-engine", "slab", "storage engine: slab (default), file (diagnostic), mem (diagnostic, not persistent)")
	fs.Var(&o.extent, "extent-size", "slab extent file size (default 256MiB, smaller when the capacity needs it)")
	fs.IntVar(&o.metricsPort, "metrics-port", 0, "HTTP port for /metrics, /healthz, /readyz (0 = off)")
	fs.Var(&o.maxMsg, "max-msg", "largest value accepted (bytes)")
	fs.IntVar(&o.maxConns, "max-conns", 4096, "open data connections allowed")
	fs.IntVar(&o.firstReqMS, "first-req-ms", 30000, "a new connection must send its first request within this")
	fs.IntVar(&o.ioTimeoutMS, "io-timeout-ms", 30000, "deadline for each payload read and reply write")
	fs.IntVar(&o.idleMS, "idle-timeout-ms", 600000, "close data connections idle this long")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound data address (host:port) to this file once listening")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn, error")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	addTierFlags(fs, &o.tier)
	addRDMAFlags(fs, &o.rdma)
	o.mds.define(fs)
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
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if err != nil {
		return cli.ParseFailed("dfkv_server", err)
	}
	return cli.RunDaemon("dfkv_server", o.showVersion, o.logLevel, func(log *slog.Logger) error { return serve(o, log) })
}

func serve(o *options, log *slog.Logger) error {
	limits := wire.DefaultLimits()
	limits.MaxValue = uint64(o.maxMsg)
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("--max-msg: %w", err)
	}
	var dirs []string
	for _, d := range strings.Split(o.dirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			dirs = append(dirs, d)
		}
	}
	engine, err := openEngine(engineConfig{
		kind: o.engine, dirs: dirs, capacity: int64(o.capacity), maxValue: int64(o.maxMsg), extent: int64(o.extent), log: log,
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dfkv_server_build_info", Help: "Build and configuration of this node."}, []string{"version", "engine"})
	buildInfo.WithLabelValues(version.Version, o.engine).Set(1)
	reg.MustRegister(buildInfo)
	m := server.NewMetrics(reg, engine)
	rdmaSrv, err := setupRDMA(o.rdma, engine, limits.MaxValue, reg, log)
	if err != nil {
		closeEngine()
		return err
	}
	var rdma server.RDMAServer
	if rdmaSrv != nil {
		rdma = rdmaSrv
		defer rdmaSrv.Close() // error paths; the drain below closes it before the engine
	}

	srv, err := server.New(server.Config{
		RDMA:   rdma,
		Engine: engine, Limits: limits, MaxConns: o.maxConns,
		FirstRequestTimeout: time.Duration(o.firstReqMS) * time.Millisecond,
		IOTimeout:           time.Duration(o.ioTimeoutMS) * time.Millisecond,
		IdleTimeout:         time.Duration(o.idleMS) * time.Millisecond,
		SoftwareVersion:     version.Version, Logger: log, Metrics: m,
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
	var nodeReg nodeRegistration
	var httpSrv *metrics.HTTPServer
	if o.metricsPort > 0 {
		httpSrv, err = metrics.StartHTTP(metrics.HTTPConfig{
			Addr: net.JoinHostPort(o.host, strconv.Itoa(o.metricsPort)), Gatherer: reg, Logger: log,
			Ready: func() error {
				if !engine.Stats().Healthy {
					return errors.New("store unhealthy")
				}
				return nodeReg.ready()
			},
		})
		if err != nil {
			ln.Close()
			closeEngine()
			return err
		}
		log.Info("metrics listening", "addr", httpSrv.Addr())
	}
	addr := ln.Addr().String()
	if o.addrFile != "" {
		tmp := o.addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err == nil {
			err = os.Rename(tmp, o.addrFile)
		}
	}
	log.Info("dfkv_server listening", "addr", addr, "engine", o.engine, "dirs", strings.Join(dirs, ","),
		"cap", int64(o.capacity), "version", version.Version)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if err := nodeReg.start(&o.mds, addr, log); err != nil {
		log.Error("mds registration", "err", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var serveErr error
	select {
	case s := <-sig:
		log.Info("draining", "signal", s.String())
	case serveErr = <-errc:
		log.Error("listener failed", "err", serveErr)
	}
	nodeReg.stop(log) // leave the ring first, so clients stop routing here
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("drain deadline passed; closed remaining connections", "err", err)
	}
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
