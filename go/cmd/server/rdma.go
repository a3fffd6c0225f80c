package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/rails"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

type rdmaOptions struct {
	enable          bool
	provider, devs  string
	primary, tiers  string
	serverProtocol  int
	segment         cli.Size
	depth           int
	healthInterval  time.Duration
	recoverySamples int
	notify          bool
	notifyFallback  bool
	gidIndex        int // -1 = chosen per connection
	hopLimit        int
	trafficClass    int
	deviceTargets   bool
	maxTargets      int
}

func addRDMAFlags(fs *flag.FlagSet, o *rdmaOptions) {
	o.segment = 256 << 20
	fs.BoolVar(&o.enable, "rdma", false, "serve RDMA v2 (one-sided) beside TCP; see docs/RDMA.md")
	fs.StringVar(&o.provider, "rdma-provider", "ibverbs", "ibverbs (rdma-core, loaded at run time) or soft (software NIC: tests and demos only)")
	fs.StringVar(&o.devs, "rdma-dev", "", "comma-separated RDMA devices allowed; naming any makes RDMA mandatory (refuse to start when none works)")
	fs.IntVar(&o.serverProtocol, "rdma-server-protocol", 0, "1 answers every client with v1 (rollout and rollback); 0 = auto")
	fs.Var(&o.segment, "rdma-segment", "registered receive segment shared by all RDMA connections (bytes)")
	fs.IntVar(&o.depth, "rdma-depth", 16, "requests in flight per RDMA connection")
	fs.StringVar(&o.primary, "rdma-primary-dev", "", "preferred rail: served first when it has an ACTIVE port (must be in --rdma-dev when that is set)")
	fs.StringVar(&o.tiers, "rdma-tiers", "", "selection tiers over --rdma-dev, leftmost preferred: mlx5_0,mlx5_1;mlx5_2 (published in HLT1)")
	fs.DurationVar(&o.healthInterval, "rdma-health-interval", 2*time.Second, "how often the rails are re-queried (port and link state)")
	fs.IntVar(&o.recoverySamples, "rdma-health-recovery-samples", 3, "consecutive healthy samples a rail that was down needs before it is healthy again")
	fs.BoolVar(&o.notify, "rdma-notify", true, "answer a client's native notification QP (drain notices over RDMA, not TCP)")
	fs.BoolVar(&o.notifyFallback, "rdma-notify-oob-fallback", false, "send a notification a client cannot take natively over its bootstrap TCP connection")
	fs.IntVar(&o.gidIndex, "rdma-gid-index", -1, "source GID index on every RDMA connection (0..255); -1 = chosen per connection: RoCE v2 of the client's version and address family, the IPv4-mapped GID of the local address first (docs/RDMA.md §8)")
	fs.IntVar(&o.hopLimit, "rdma-hop-limit", verbs.DefaultHopLimit, "hop limit (IPv4 TTL) of RoCE v2 packets, 1..255")
	fs.IntVar(&o.maxTargets, "rdma-max-targets", 128, "GET targets one RDMA request may name (1..254; a direct load names one per layer piece; each costs a send-queue entry per request in flight)")
	fs.BoolVar(&o.deviceTargets, "rdma-device-targets", true, "accept GET targets in clients' device memory (DMA-BUF: direct GPU loads); false makes clients refuse direct loads to this node")
	fs.IntVar(&o.trafficClass, "rdma-traffic-class", 0, "traffic class byte of RoCE packets (DSCP<<2 | ECN, 0..255; e.g. 106 = DSCP 26 with ECT(0) for a lossless class)")
}

// gidPolicy is the validated GID choice policy of the flags.
func (o *rdmaOptions) gidPolicy() (verbs.GIDPolicy, error) {
	if o.gidIndex < -1 || o.gidIndex > verbs.MaxGIDIndex {
		return verbs.GIDPolicy{}, fmt.Errorf("--rdma-gid-index %d: want -1 (per connection) or 0..%d", o.gidIndex, verbs.MaxGIDIndex)
	}
	if o.hopLimit < 1 || o.hopLimit > 255 {
		return verbs.GIDPolicy{}, fmt.Errorf("--rdma-hop-limit %d: want 1..255", o.hopLimit)
	}
	if o.trafficClass < 0 || o.trafficClass > 255 {
		return verbs.GIDPolicy{}, fmt.Errorf("--rdma-traffic-class %d: want 0..255", o.trafficClass)
	}
	return verbs.GIDPolicy{Index: max(o.gidIndex, 0), HasIndex: o.gidIndex >= 0, HopLimit: uint8(o.hopLimit), TrafficClass: uint8(o.trafficClass)}, nil
}

// validate refuses rail flags that cannot work, before anything opens (setupRDMA checks
// the devices themselves against the provider).
func (o *rdmaOptions) validate() error {
	devs, err := rails.ParseList(o.devs)
	if err != nil {
		return fmt.Errorf("--rdma-dev: %w", err)
	}
	if _, err := rails.Plan(devs, o.tiers, o.primary); err != nil {
		return err
	}
	if o.serverProtocol != 0 && o.serverProtocol != 1 {
		return fmt.Errorf("--rdma-server-protocol %d: want 0 (auto) or 1", o.serverProtocol)
	}
	if _, err := o.gidPolicy(); err != nil {
		return err
	}
	if o.healthInterval <= 0 || o.recoverySamples < 1 {
		return fmt.Errorf("--rdma-health-interval %v / --rdma-health-recovery-samples %d: want > 0 and >= 1", o.healthInterval, o.recoverySamples)
	}
	return nil
}

// rdmaProvider builds the provider. The soft provider creates as many devices as
// DFKV_SOFT_RDMA_DEVICES says, and at least enough for every softN the list names.
func rdmaProvider(name string, devs []string) (verbs.Provider, error) {
	switch name {
	case "ibverbs":
		return ibverbs.New(ibverbs.Options{}), nil
	case "soft":
		n := 0
		for _, d := range devs {
			if i, err := strconv.Atoi(strings.TrimPrefix(d, "soft")); err == nil && strings.HasPrefix(d, "soft") && i >= 0 && i < soft.MaxDevices {
				n = max(n, i+1)
			}
		}
		e, err := soft.ParseDevices(os.Getenv(soft.DevicesEnv))
		if err != nil {
			return nil, err
		}
		return soft.New(soft.Options{Devices: max(n, e), FaultFile: os.Getenv(soft.FaultsEnv)})
	}
	return nil, fmt.Errorf("--rdma-provider %q: want ibverbs or soft", name)
}

// memlockLimit is the process's locked-memory budget (a seam for tests).
var memlockLimit = verbs.Memlock

// memlockVerdict says, in one line, when the receive segment cannot be pinned under the
// memlock limit: ibverbs registers it at start (the soft NIC pins nothing). Checked only
// where the provider has devices, so that a machine without RDMA keeps saying that.
// Per-connection registrations that later pass the limit fail with the same line
// (ibverbs reg_mr), and that connection is refused.
func memlockVerdict(p verbs.Provider, segment uint64, l verbs.MemlockLimit) error {
	if p.Name() != "ibverbs" {
		return nil
	}
	if _, err := p.Devices(); err != nil {
		return nil // no device: the server says that instead
	}
	return l.Check(segment, "the receive segment (--rdma-segment)")
}

// checkListed refuses an explicit --rdma-dev list naming a device the provider does not
// have: startup never shrinks the configured rails (a present device whose port is down is
// accepted, published Down and monitored).
func checkListed(p verbs.Provider, devs []string) error {
	have, err := p.Devices()
	if err != nil {
		return fmt.Errorf("rdma: --rdma-dev %s: %w", strings.Join(devs, ","), err)
	}
	names := map[string]bool{}
	var all []string
	for _, d := range have {
		names[d.Name] = true
		all = append(all, d.Name)
	}
	for _, d := range devs {
		if !names[d] {
			return fmt.Errorf("rdma: --rdma-dev %s: no device %q (provider %s has %s)", strings.Join(devs, ","), d, p.Name(), strings.Join(all, ","))
		}
	}
	return nil
}

// setupRDMA returns the RDMA server and its rail monitor, or nils when RDMA is off or not
// usable here (said in one log line; TCP serves). An explicit --rdma-dev list that cannot be
// satisfied, or a bad --rdma-tiers / --rdma-primary-dev, is an error: the node refuses to
// start rather than silently serve TCP only.
func setupRDMA(o rdmaOptions, engine store.Engine, maxValue uint64, reg prometheus.Registerer, log *slog.Logger) (rdmaServing, *rails.Monitor, error) {
	devs, err := rails.ParseList(o.devs)
	if err != nil {
		return nil, nil, fmt.Errorf("--rdma-dev: %w", err)
	}
	if !o.enable && len(devs) == 0 {
		return nil, nil, nil
	}
	if o.serverProtocol != 0 && o.serverProtocol != 1 {
		return nil, nil, fmt.Errorf("--rdma-server-protocol %d: want 0 (auto) or 1", o.serverProtocol)
	}
	if o.maxTargets < 0 || o.maxTargets > onesided.MaxTargets {
		return nil, nil, fmt.Errorf("--rdma-max-targets %d: want 1..%d (0: 16)", o.maxTargets, onesided.MaxTargets)
	}
	specs, err := rails.Plan(devs, o.tiers, o.primary)
	if err != nil {
		return nil, nil, err
	}
	if o.healthInterval <= 0 || o.recoverySamples < 1 {
		return nil, nil, fmt.Errorf("--rdma-health-interval %v / --rdma-health-recovery-samples %d: want > 0 and >= 1", o.healthInterval, o.recoverySamples)
	}
	gid, err := o.gidPolicy()
	if err != nil {
		return nil, nil, err
	}
	p, err := rdmaProvider(o.provider, append(devs, o.primary))
	if err != nil {
		return nil, nil, err
	}
	if len(devs) > 0 {
		if err := checkListed(p, devs); err != nil {
			return nil, nil, err
		}
	}
	if err := memlockVerdict(p, uint64(o.segment), memlockLimit()); err != nil {
		if len(devs) > 0 {
			return nil, nil, fmt.Errorf("rdma: --rdma-dev %s: %w", o.devs, err)
		}
		log.Warn("rdma not in use; serving TCP only", "provider", o.provider, "reason", err.Error())
		return nil, nil, nil
	}
	cfg := onesided.Config{Provider: p, MaxBlock: maxValue, Depth: uint32(max(o.depth, 1)),
		SegmentBytes: uint64(o.segment), ForceV1: o.serverProtocol == 1, Logger: log, GID: gid,
		Notify: onesided.NotifyConfig{Enabled: o.notify, OOBFallback: o.notifyFallback}, NoDeviceTargets: !o.deviceTargets,
		MaxTargets: uint32(o.maxTargets)}
	var srv rdmaServing
	var rs *onesided.RailServer
	primary := strings.TrimSpace(o.primary)
	switch {
	case len(devs) > 0:
		// Every listed rail with an ACTIVE port serves (primary first, then by tier); a
		// connection lands on the rail its offer names while that rail is healthy.
		var skipped map[string]error
		rs, skipped, err = onesided.NewRailServer(cfg, engine, rails.ServeOrder(specs, primary))
		if err != nil {
			return nil, nil, fmt.Errorf("rdma: --rdma-dev %s: %w", o.devs, err)
		}
		for d, why := range skipped {
			log.Warn("rdma rail not served yet (published and monitored; served once it is healthy)", "rail", d, "reason", why.Error())
		}
		srv = rs
	case primary != "":
		cfg.Device = primary
		s, err := onesided.NewServer(cfg, engine)
		if err != nil {
			log.Warn("rdma: --rdma-primary-dev cannot serve; using the first ACTIVE device", "device", primary, "err", err)
			cfg.Device = ""
			s, err = onesided.NewServer(cfg, engine)
		}
		if err != nil {
			log.Warn("rdma not in use; serving TCP only", "provider", o.provider, "reason", err.Error())
			return nil, nil, nil
		}
		srv = s
	default:
		s, err := onesided.NewServer(cfg, engine)
		if err != nil {
			log.Warn("rdma not in use; serving TCP only", "provider", o.provider, "reason", err.Error())
			return nil, nil, nil
		}
		srv = s
	}
	if len(specs) == 0 {
		specs = []rails.Spec{{Device: srv.Device()}} // discovered: the one device it serves on
	}
	mon, err := rails.NewMonitor(rails.Config{Provider: p, Rails: specs, RecoverySamples: o.recoverySamples,
		Interval: o.healthInterval, Logger: log})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	var served []string
	if rs != nil {
		rs.SetHealth(mon.Healthy)
		served = rs.Devices()
	} else {
		served = []string{srv.Device()}
	}
	var published []string
	for _, r := range mon.Rails() {
		published = append(published, fmt.Sprintf("%s(tier %d, %s)", r.Device, r.Tier, r.State()))
	}
	log.Info("rdma serving", "provider", o.provider, "served", strings.Join(served, ","), "rails", strings.Join(published, ","),
		"segment", int64(o.segment), "force_v1", cfg.ForceV1)
	if reg != nil {
		registerRDMAMetrics(reg, srv)
		mon.Register(reg)
		if rs != nil {
			reg.MustRegister(&railConnCollector{rs: rs,
				opened:      prometheus.NewDesc("dfkv_rdma_rail_conns_opened_total", "RDMA connections (v1 and v2) served on the rail.", []string{"rail"}, nil),
				active:      prometheus.NewDesc("dfkv_rdma_rail_active_conns", "RDMA connections open on the rail.", []string{"rail"}, nil),
				notifySends: prometheus.NewDesc("dfkv_rdma_rail_notify_sends_total", "Native notifications submitted on the rail.", []string{"rail"}, nil),
				notifyFB:    prometheus.NewDesc("dfkv_rdma_rail_notify_fallbacks_total", "Notifications sent over bootstrap TCP instead (rail's connections).", []string{"rail"}, nil),
				notifyD:     prometheus.NewDesc("dfkv_rdma_rail_notify_drops_total", "Notification completions dropped (old generation, endpoint gone) on the rail.", []string{"rail"}, nil),
			})
		}
	}
	return srv, mon, nil
}

// railAnnouncer tells the RDMA clients connected now when a rail's published health
// changes (a dfkv.rail notification, natively; over TCP only with the fallback on).
type railAnnouncer struct {
	last map[string]uint32 // device -> generation last announced
}

func (a *railAnnouncer) announce(srv rdmaServing, published []wire.Rail, log *slog.Logger) {
	b, ok := srv.(interface {
		Broadcast(ctx context.Context, name string, body []byte) (int, error)
	})
	if !ok {
		return
	}
	if a.last == nil {
		a.last = map[string]uint32{}
	}
	for _, r := range published {
		if g, seen := a.last[r.Device]; seen && g == r.Generation {
			continue
		}
		first := a.last[r.Device] == 0
		a.last[r.Device] = r.Generation
		if first && r.Generation <= 1 {
			continue // the state at start: nothing changed
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := b.Broadcast(ctx, onesided.NotifyRail, onesided.RailEventBody(r.Device, r.Health.String(), r.Generation))
		cancel()
		if err != nil {
			log.Info("rdma rail event not sent to every connection", "rail", r.Device, "sent", n, "err", err)
		}
	}
}

// serveRecoveredRails starts serving a listed rail that was down at start once it is
// published Healthy (a RailServer only; a no-op for rails already served).
func serveRecoveredRails(srv rdmaServing, published []wire.Rail, log *slog.Logger) {
	rs, ok := srv.(*onesided.RailServer)
	if !ok {
		return
	}
	served := map[string]bool{}
	for _, d := range rs.Devices() {
		served[d] = true
	}
	for _, r := range published {
		if r.Health != fb.RailHealthHealthy || served[r.Device] {
			continue
		}
		if err := rs.AddRail(r.Device); err != nil {
			log.Warn("rdma rail healthy again but not served", "rail", r.Device, "err", err)
		} else {
			log.Info("rdma rail now served", "rail", r.Device)
		}
	}
}

// rdmaServing is what dfkv_server needs of its RDMA side: a Server (one device) or a
// RailServer (every listed rail).
type rdmaServing interface {
	server.RDMAServer
	Stats() map[string]float64
	Device() string
	Close() error
}

// railConnCollector exports each rail's connection counts and native notifications.
type railConnCollector struct {
	rs                             *onesided.RailServer
	opened, active                 *prometheus.Desc
	notifySends, notifyFB, notifyD *prometheus.Desc
}

func (c *railConnCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.opened, c.active, c.notifySends, c.notifyFB, c.notifyD} {
		ch <- d
	}
}

func (c *railConnCollector) Collect(ch chan<- prometheus.Metric) {
	for rail, st := range c.rs.RailStats() {
		ch <- prometheus.MustNewConstMetric(c.opened, prometheus.CounterValue,
			st["dfkv_rdma_v1_conns_opened_total"]+st["dfkv_rdma_v2_conns_opened_total"], rail)
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, st["dfkv_rdma_active_conns"], rail)
		ch <- prometheus.MustNewConstMetric(c.notifySends, prometheus.CounterValue, st["dfkv_rdma_notify_sends_total"], rail)
		ch <- prometheus.MustNewConstMetric(c.notifyFB, prometheus.CounterValue, st["dfkv_rdma_notify_fallbacks_total"], rail)
		ch <- prometheus.MustNewConstMetric(c.notifyD, prometheus.CounterValue, st["dfkv_rdma_notify_drops_total"], rail)
	}
}

func registerRDMAMetrics(reg prometheus.Registerer, s interface{ Stats() map[string]float64 }) {
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

var (
	_ rdmaServing = (*onesided.Server)(nil)
	_ rdmaServing = (*onesided.RailServer)(nil)
)
