// Command dfkv_mds is the dfkv membership directory: a stateless front for etcd that cache
// nodes register with and clients poll for the topology. Run any number of replicas
// against one etcd; nodes and clients fail over between them by themselves.
//
//	dfkv_mds --listen 9400 --etcd embedded:/var/lib/dfkv/etcd    single box (default)
//	dfkv_mds --listen 9400 --etcd 10.0.0.1:2379,10.0.0.2:2379     external etcd
//
// Every flag has a DFKV_* environment twin (--lease-ttl ↔ DFKV_LEASE_TTL), like
// dfkv_server's.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/mds"
	"github.com/dfkv/dfkv/go/internal/metrics"
	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/version"
)

func main() { os.Exit(run(os.Args[1:])) }

type options struct {
	host, listen, etcd, addrFile, logLevel string
	etcdClientAddr, etcdPeerAddr           string
	leaseTTL, etcdTimeout, probeInterval   time.Duration
	clientLeaseTTL                         time.Duration
	statusPoll                             time.Duration
	metricsPort, maxConns, firstReqMS      int
	showVersion                            bool
	etcdCA, etcdCert, etcdKey              string
	sec                                    cli.Security
}

func parse(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("dfkv_mds", flag.ContinueOnError)
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fs.StringVar(&o.listen, "listen", "9400", "MDS port (0 picks a free one), or HOST:PORT")
	fs.StringVar(&o.etcd, "etcd", "embedded:"+cli.DataDir("etcd"), "etcd endpoints host:port[,...], or embedded:DIR to run etcd in-process")
	fs.StringVar(&o.etcdClientAddr, "etcd-client-addr", "127.0.0.1:2379", "embedded etcd: client listener (other MDS replicas may use it as --etcd)")
	fs.StringVar(&o.etcdPeerAddr, "etcd-peer-addr", "127.0.0.1:2380", "embedded etcd: peer listener")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", mds.DefaultLeaseTTL, "lease of a cache node's registration: a node that stops heartbeating (TTL/3) leaves the ring after it")
	fs.DurationVar(&o.clientLeaseTTL, "client-lease-ttl", mds.DefaultClientLeaseTTL, "lease of a client's registration (dfkvctl clients); clients are never in the ring")
	fs.DurationVar(&o.etcdTimeout, "etcd-timeout", 1500*time.Millisecond, "deadline of the etcd work of one request (below the clients' 2 s MDS deadline, so an etcd outage answers IOError instead of timing clients out)")
	fs.DurationVar(&o.probeInterval, "ready-probe-interval", time.Second, "how often /readyz's etcd probe runs (the answer is cached)")
	fs.IntVar(&o.metricsPort, "metrics-port", 0, "HTTP port for /metrics, /healthz, /readyz and the /status page (0 = off)")
	fs.DurationVar(&o.statusPoll, "status-poll", 5*time.Second, "/status: how often the page refreshes and re-scrapes the nodes' /metrics")
	fs.IntVar(&o.maxConns, "max-conns", mds.DefaultMaxConns, "open MDS connections allowed (a client following the ring holds up to two)")
	fs.IntVar(&o.firstReqMS, "first-req-ms", 10000, "a new connection must send its first request within this")
	fs.StringVar(&o.addrFile, "addr-file", "", "write the bound MDS address (host:port) to this file once listening")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn, error")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.etcdCA, "etcd-cacert", "", "external etcd over TLS: PEM CA that verifies the etcd servers")
	fs.StringVar(&o.etcdCert, "etcd-cert", "", "external etcd over TLS: client certificate (with --etcd-key)")
	fs.StringVar(&o.etcdKey, "etcd-key", "", "private key of --etcd-cert")
	o.sec.Define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dfkv_mds [flags]\nEvery flag also reads DFKV_<FLAG> (e.g. --lease-ttl ↔ DFKV_LEASE_TTL).\n\n")
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
	if o.leaseTTL < time.Second || o.clientLeaseTTL < time.Second {
		return nil, fmt.Errorf("--lease-ttl %v / --client-lease-ttl %v: at least 1s", o.leaseTTL, o.clientLeaseTTL)
	}
	if o.etcdTimeout <= 0 || o.probeInterval <= 0 || o.statusPoll <= 0 {
		return nil, errors.New("--etcd-timeout, --ready-probe-interval and --status-poll must be positive")
	}
	if err := o.sec.Validate(); err != nil {
		return nil, err
	}
	if (o.etcdCert == "") != (o.etcdKey == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	if (o.etcdCA != "" || o.etcdCert != "") && strings.HasPrefix(o.etcd, "embedded:") {
		return nil, errors.New("--etcd-cacert/--etcd-cert are for an external etcd (--etcd HOST:PORT,...)")
	}
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if err != nil {
		return cli.ParseFailed("dfkv_mds", err)
	}
	return cli.RunDaemon("dfkv_mds", o.showVersion, o.logLevel, func(log *slog.Logger, stop *cli.Stop) error { return serve(o, log, stop) })
}

func serve(o *options, log *slog.Logger, stop *cli.Stop) error {
	var endpoints []string
	mode := "external"
	var emb *mds.Embedded
	if dir, ok := strings.CutPrefix(o.etcd, "embedded:"); ok {
		if dir == "" {
			return errors.New("--etcd embedded:DIR needs a directory")
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("embedded etcd dir: %w", err)
		}
		var err error
		emb, err = mds.StartEmbedded(mds.EmbeddedConfig{Dir: dir, ClientAddr: o.etcdClientAddr, PeerAddr: o.etcdPeerAddr})
		if err != nil {
			return err
		}
		defer emb.Close()
		endpoints, mode = []string{emb.Endpoint}, "embedded"
		log.Info("embedded etcd serving", "dir", dir, "client", emb.Endpoint)
	} else {
		for _, e := range strings.Split(o.etcd, ",") {
			if e = strings.TrimSpace(e); e != "" {
				endpoints = append(endpoints, e)
			}
		}
		if len(endpoints) == 0 {
			return errors.New("--etcd: no endpoints")
		}
	}
	var etcdTLS *tls.Config
	if files := (secure.TLSFiles{CA: o.etcdCA, Cert: o.etcdCert, Key: o.etcdKey}); files.ClientEnabled() {
		t, err := secure.LoadClient(files, log)
		if err != nil {
			return fmt.Errorf("--etcd-cacert/--etcd-cert: %w", err)
		}
		etcdTLS = t.Config()
	}
	store, err := mds.NewEtcdStoreTLS(endpoints, o.etcdTimeout, etcdTLS)
	if err != nil {
		return err
	}
	defer store.Close()
	sec, err := o.sec.Load(log)
	if err != nil {
		return err
	}
	sec.Start(o.sec.ReloadEvery)
	defer sec.Stop()

	reg := cli.NewRegistry("dfkv_mds_build_info", "Build and etcd mode of this MDS.", "etcd", mode)
	m := mds.NewMetrics(reg)

	prober := mds.NewProber(store, o.probeInterval, min(o.etcdTimeout, o.probeInterval*2), 2, m)
	prober.Start()
	defer prober.Stop()
	svc, err := mds.NewService(mds.Config{Store: store, LeaseTTL: o.leaseTTL, ClientLeaseTTL: o.clientLeaseTTL, CallTimeout: o.etcdTimeout,
		Healthy: prober.Ready, Logger: log, Metrics: m})
	if err != nil {
		return err
	}
	stopRefresh := refreshGauges(svc, m, o.etcdTimeout)
	defer stopRefresh()

	srv, err := mds.NewServer(mds.ServerConfig{Service: svc, MaxConns: o.maxConns,
		FirstRequestTimeout: time.Duration(o.firstReqMS) * time.Millisecond, Logger: log, Metrics: m, Auth: sec.Tokens})
	if err != nil {
		return err
	}
	laddr := net.JoinHostPort(o.host, o.listen)
	if strings.Contains(o.listen, ":") {
		laddr = o.listen // --listen HOST:PORT
	}
	ln, err := net.Listen("tcp", laddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg := sec.ServerTLS(); cfg != nil {
		ln = tls.NewListener(ln, cfg) // handshake runs in the connection's goroutine, bounded
	}
	if host, _, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		sec.WarnIfOpen(log, host)
	}
	// /healthz is liveness only and never touches etcd; /readyz reads the prober's cached,
	// debounced answer; /status is the live cluster page.
	var handlers map[string]http.Handler
	if o.metricsPort > 0 {
		status, err := mds.NewStatusPage(mds.StatusConfig{Service: svc, EtcdReady: prober.Ready, Groups: m.Groups,
			Version: version.Version, EtcdMode: mode, PollInterval: o.statusPoll, ScrapeTimeout: min(2*time.Second, o.statusPoll), Logger: log})
		if err != nil {
			ln.Close()
			return err
		}
		handlers = map[string]http.Handler{"/status": status}
	}
	httpSrv, err := cli.StartMetrics(o.host, o.metricsPort, metrics.HTTPConfig{Gatherer: reg, Ready: prober.Ready, Logger: log,
		TLS: sec.ServerTLS(), FirstRequestLimit: time.Duration(o.firstReqMS) * time.Millisecond, Handlers: handlers})
	if err != nil {
		ln.Close()
		return err
	}
	addr := ln.Addr().String()
	stop.Ready() // from here a stop signal is a clean stop (Wait below)
	if err := cli.WriteAddrFile(o.addrFile, addr); err != nil {
		ln.Close()
		return err
	}
	log.Info("dfkv_mds listening", "addr", addr, "etcd", strings.Join(endpoints, ","), "mode", mode, "lease_ttl", o.leaseTTL, "client_lease_ttl", o.clientLeaseTTL, "version", version.Version)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	failures := map[string]<-chan error{"listener": errc}
	if emb != nil {
		failures["embedded etcd"] = emb.Err()
	}
	serveErr := stop.Wait(log, failures)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	svc.Close()
	if httpSrv != nil {
		_ = httpSrv.Close(ctx)
	}
	log.Info("stopped")
	if serveErr != nil && !errors.Is(serveErr, mds.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// refreshGauges keeps dfkv_mds_group_{members,clients} current for every group seen, even
// when nobody lists it (e.g. only heartbeats arrive).
func refreshGauges(svc *mds.Service, m *mds.Metrics, timeout time.Duration) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for _, g := range m.Groups() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				_, _ = svc.Topology(ctx, g)
				_, _ = svc.Clients(ctx, g)
				cancel()
			}
		}
	}()
	return func() { close(stop); <-done }
}
