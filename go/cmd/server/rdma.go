package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

type rdmaOptions struct {
	enable         bool
	provider, devs string
	serverProtocol int
	segment        cli.Size
	depth          int
}

func addRDMAFlags(fs *flag.FlagSet, o *rdmaOptions) {
	o.segment = 256 << 20
	fs.BoolVar(&o.enable, "rdma", false, "serve RDMA v2 (one-sided) beside TCP; see docs/RDMA.md")
	fs.StringVar(&o.provider, "rdma-provider", "ibverbs", "ibverbs (rdma-core, loaded at run time) or soft (software NIC: tests and demos only)")
	fs.StringVar(&o.devs, "rdma-dev", "", "comma-separated RDMA devices allowed; naming any makes RDMA mandatory (refuse to start when none works)")
	fs.IntVar(&o.serverProtocol, "rdma-server-protocol", 0, "1 answers every client with v1 (rollout and rollback); 0 = auto")
	fs.Var(&o.segment, "rdma-segment", "registered receive segment shared by all RDMA connections (bytes)")
	fs.IntVar(&o.depth, "rdma-depth", 16, "requests in flight per RDMA connection")
}

func rdmaProvider(name string) (verbs.Provider, error) {
	switch name {
	case "ibverbs":
		return ibverbs.New(ibverbs.Options{}), nil
	case "soft":
		return soft.New(soft.Options{})
	}
	return nil, fmt.Errorf("--rdma-provider %q: want ibverbs or soft", name)
}

// setupRDMA returns the RDMA server, or nil when RDMA is off or not usable here (said in
// one log line; TCP serves). An explicit --rdma-dev list that cannot be satisfied is an
// error: the node refuses to start rather than silently serve TCP only.
func setupRDMA(o rdmaOptions, engine store.Engine, maxValue uint64, reg prometheus.Registerer, log *slog.Logger) (*onesided.Server, error) {
	var devs []string
	for _, d := range strings.Split(o.devs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			devs = append(devs, d)
		}
	}
	if !o.enable && len(devs) == 0 {
		return nil, nil
	}
	if o.serverProtocol != 0 && o.serverProtocol != 1 {
		return nil, fmt.Errorf("--rdma-server-protocol %d: want 0 (auto) or 1", o.serverProtocol)
	}
	p, err := rdmaProvider(o.provider)
	if err != nil {
		return nil, err
	}
	cfg := onesided.Config{Provider: p, MaxBlock: maxValue, Depth: uint32(max(o.depth, 1)),
		SegmentBytes: uint64(o.segment), ForceV1: o.serverProtocol == 1, Logger: log}
	var s *onesided.Server
	if len(devs) == 0 {
		s, err = onesided.NewServer(cfg, engine)
	} else {
		var errs []error
		for _, d := range devs {
			cfg.Device = d
			if s, err = onesided.NewServer(cfg, engine); err == nil {
				break
			}
			errs = append(errs, err)
		}
		if s == nil {
			return nil, fmt.Errorf("rdma: --rdma-dev %s: %w", o.devs, errors.Join(errs...))
		}
	}
	if err != nil {
		log.Warn("rdma not in use; serving TCP only", "provider", o.provider, "reason", err.Error())
		return nil, nil
	}
	log.Info("rdma serving", "provider", o.provider, "device", cfg.Device, "segment", int64(o.segment), "force_v1", cfg.ForceV1)
	if reg != nil {
		registerRDMAMetrics(reg, s)
	}
	return s, nil
}

func registerRDMAMetrics(reg prometheus.Registerer, s *onesided.Server) {
	for name := range s.Stats() {
		n := name
		f := func() float64 { return s.Stats()[n] }
		if strings.HasSuffix(n, "_total") {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		} else {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: n, Help: "RDMA data plane (docs/RDMA.md)."}, f))
		}
	}
}

var _ server.RDMAServer = (*onesided.Server)(nil)
