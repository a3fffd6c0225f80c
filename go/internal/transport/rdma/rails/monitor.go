package rails

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Config configures a Monitor.
type Config struct {
	Provider verbs.Provider
	Rails    []Spec
	// RecoverySamples is how many consecutive healthy samples a rail that was down needs
	// before it is Healthy again (Quarantined meanwhile). Default 3; 1 = at once.
	RecoverySamples int
	// Interval between samples when started. Default 2 s.
	Interval time.Duration
	Logger   *slog.Logger
}

type railState struct {
	pub     wire.Rail
	healthy int // consecutive healthy samples while Quarantined
	changes int64
}

// Monitor samples the configured rails. NewMonitor takes the first sample.
type Monitor struct {
	cfg Config

	mu    sync.Mutex
	rails []railState

	started  atomic.Bool
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// NewMonitor validates cfg and takes the first sample (a rail that is down at start is
// published Down, not refused: it is monitored and may come up).
func NewMonitor(cfg Config) (*Monitor, error) {
	if cfg.Provider == nil {
		return nil, errors.New("rails: no provider")
	}
	if len(cfg.Rails) == 0 || len(cfg.Rails) > wire.MaxMdsRails {
		return nil, fmt.Errorf("%w: %d rails (want 1..%d)", ErrConfig, len(cfg.Rails), wire.MaxMdsRails)
	}
	if cfg.RecoverySamples <= 0 {
		cfg.RecoverySamples = 3
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Monitor{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	for _, s := range cfg.Rails {
		m.rails = append(m.rails, railState{pub: wire.Rail{Device: s.Device, Tier: s.Tier, NUMANode: -1}})
	}
	m.sample(true)
	return m, nil
}

// Rails returns the rails as published now.
func (m *Monitor) Rails() []wire.Rail {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]wire.Rail, len(m.rails))
	for i := range m.rails {
		out[i] = m.rails[i].pub
	}
	return out
}

// Healthy reports whether dev is a configured rail published Healthy now.
func (m *Monitor) Healthy(dev string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rails {
		if r.pub.Device == dev {
			return r.pub.Health == fb.RailHealthHealthy
		}
	}
	return false
}

// Sample queries the provider once and reports whether a published field changed.
func (m *Monitor) Sample() bool { return m.sample(false) }

func (m *Monitor) sample(first bool) bool {
	devs, err := m.cfg.Provider.Devices()
	byName := map[string]verbs.DeviceInfo{}
	if err == nil {
		for _, d := range devs {
			byName[d.Name] = d
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for i := range m.rails {
		r := &m.rails[i]
		next := r.pub
		d, ok := byName[r.pub.Device]
		next.QueryOK = ok
		up := false
		if ok {
			port, active := d.ActivePort()
			if !active && len(d.Ports) > 0 {
				port = d.Ports[0]
			}
			next.Port, next.PortState, next.PhysState = port.Num, uint8(port.State), uint8(port.PhysState)
			next.NUMANode = int16(max(min(d.NUMANode, 32767), -1))
			up = active
		} else {
			next.PortState, next.PhysState = 0, 0
		}
		health := r.pub.Health
		switch {
		case !up:
			health = fb.RailHealthDown
			r.healthy = 0
		case first || health == fb.RailHealthHealthy:
			health = fb.RailHealthHealthy
		default: // up again after being down: quarantined until enough healthy samples
			r.healthy++
			health = fb.RailHealthQuarantined
			if r.healthy >= m.cfg.RecoverySamples {
				health, r.healthy = fb.RailHealthHealthy, 0
			}
		}
		if health != r.pub.Health {
			next.Generation = r.pub.Generation + 1
			next.Health = health
			if !first {
				r.changes++
				lvl := slog.LevelInfo
				if health == fb.RailHealthDown {
					lvl = slog.LevelWarn
				}
				m.cfg.Logger.Log(context.Background(), lvl, "rdma rail health changed", "rail", next.Device, "health", next.State(),
					"was", r.pub.State(), "port_state", verbs.PortState(next.PortState).String(), "query_ok", next.QueryOK,
					"generation", next.Generation)
			}
		}
		if next != r.pub {
			r.pub = next
			changed = true
		}
	}
	if err != nil && !first {
		m.cfg.Logger.Debug("rdma rail query failed", "err", err)
	}
	return changed
}

// Start samples every Interval until Stop. After a sample that changed a published field,
// onChange (if not nil) gets the new rails, from the sampling goroutine, never concurrently.
func (m *Monitor) Start(onChange func([]wire.Rail)) {
	if m.started.Swap(true) {
		return
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(m.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
			}
			if m.Sample() && onChange != nil {
				onChange(m.Rails())
			}
		}
	}()
}

// Stop ends the sampling loop started by Start and waits for it.
func (m *Monitor) Stop() {
	m.stopOnce.Do(func() { close(m.stop) })
	if m.started.Load() {
		<-m.done
	}
}

// Register adds the rail gauges and counters: dfkv_server_rdma_rails_configured,
// dfkv_server_rdma_rails_active (Healthy), dfkv_rdma_rail_healthy{rail} (1 Healthy, 0
// not), dfkv_rdma_rail_health_changes_total{rail}.
func (m *Monitor) Register(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_server_rdma_rails_configured",
		Help: "RDMA rails this server publishes (docs/RDMA.md)."}, func() float64 { return float64(len(m.cfg.Rails)) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dfkv_server_rdma_rails_active",
		Help: "RDMA rails published Healthy."}, func() float64 {
		n := 0
		for _, r := range m.Rails() {
			if r.Health == fb.RailHealthHealthy {
				n++
			}
		}
		return float64(n)
	}))
	reg.MustRegister(&railCollector{m: m,
		healthy: prometheus.NewDesc("dfkv_rdma_rail_healthy", "1 when the rail is published Healthy, else 0.", []string{"rail"}, nil),
		changes: prometheus.NewDesc("dfkv_rdma_rail_health_changes_total", "Health changes of the rail since start.", []string{"rail"}, nil),
	})
}

type railCollector struct {
	m                *Monitor
	healthy, changes *prometheus.Desc
}

func (c *railCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.healthy; ch <- c.changes }

func (c *railCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for _, r := range c.m.rails {
		v := 0.0
		if r.pub.Health == fb.RailHealthHealthy {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, v, r.pub.Device)
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(r.changes), r.pub.Device)
	}
}
