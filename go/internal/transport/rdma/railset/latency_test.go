package railset

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// samples feeds n identical per-op samples of rail.
func samples(l *railLatency, rail string, perOp float64, n int) {
	for range n {
		l.observe(rail, perOp)
	}
}

func TestSplitSlow(t *testing.T) {
	const ms = 1e-3
	for _, tc := range []struct {
		name       string
		order      []string
		feed       func(l *railLatency)
		factor     float64
		primary    string
		kept, slow []string
	}{
		{name: "no samples: unchanged", order: []string{"a", "b"}, feed: func(*railLatency) {}, factor: 4,
			kept: []string{"a", "b"}},
		{name: "one slow rail demoted", order: []string{"b", "a", "c"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 50*ms, 8); samples(l, "c", 2*ms, 8) },
			kept: []string{"a", "c"}, slow: []string{"b"}},
		{name: "below the factor: unchanged", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 3.9*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "under the minimum gap: unchanged", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 0.05*ms, 8); samples(l, "b", 0.5*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "over the factor and the gap", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 0.05*ms, 8); samples(l, "b", 0.6*ms, 8) },
			kept: []string{"a"}, slow: []string{"b"}},
		{name: "too few samples of the slow rail", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 90*ms, railLatencyMinSamples-1) },
			kept: []string{"a", "b"}},
		{name: "too few samples of the fast rail", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, railLatencyMinSamples-1); samples(l, "b", 90*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "slow rail in tier 1 does not matter", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 5*ms, 8); samples(l, "b", 6*ms, 8); samples(l, "t1", 0.01*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "the primary is never demoted", order: []string{"b", "a", "c"}, factor: 4, primary: "b",
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 50*ms, 8); samples(l, "c", 20*ms, 8) },
			kept: []string{"b", "a"}, slow: []string{"c"}},
		{name: "factor off", order: []string{"a", "b"}, factor: 0,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 500*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "one rail: never demoted", order: []string{"b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 500*ms, 8) },
			kept: []string{"b"}},
		// Hysteresis: the limit is 4 ms here, the restore line 2.5 ms.
		{name: "demoted, between the restore line and the limit: stays slow", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 3*ms, 8); l.rails["b"].demoted = true },
			kept: []string{"a"}, slow: []string{"b"}},
		{name: "not demoted, same EWMA: kept", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 1*ms, 8); samples(l, "b", 3*ms, 8) },
			kept: []string{"a", "b"}},
		{name: "demoted, under the restore line: restored", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) {
				samples(l, "a", 1*ms, 8)
				samples(l, "b", 2.4*ms, 8)
				l.rails["b"].demoted = true
			},
			kept: []string{"a", "b"}},
		{name: "zero EWMA best", order: []string{"a", "b"}, factor: 4,
			feed: func(l *railLatency) { samples(l, "a", 0, 8); samples(l, "b", 0, 8) },
			kept: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l railLatency
			tc.feed(&l)
			kept, slow := splitSlow(tc.order, l.rails, tc.factor, tc.primary)
			if d := cmp.Diff(tc.kept, kept); d != "" {
				t.Errorf("kept (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.slow, slow); d != "" {
				t.Errorf("slow (-want +got):\n%s", d)
			}
		})
	}
}

// The EWMA follows a rail that speeds up: a slow rail's samples coming back to the fast
// one's level end its demotion within a bounded number of samples.
func TestRailLatencyEWMARecovers(t *testing.T) {
	var l railLatency
	samples(&l, "a", 1e-3, 8)
	samples(&l, "b", 200e-3, 8)
	if _, slow := splitSlow([]string{"a", "b"}, l.rails, 4, ""); len(slow) != 1 {
		t.Fatalf("b not slow: %v", slow)
	}
	n := 0
	for ; n < 100; n++ {
		if _, slow := splitSlow([]string{"a", "b"}, l.rails, 4, ""); len(slow) == 0 {
			break
		}
		l.observe("b", 1e-3)
	}
	if n == 0 || n > 25 {
		t.Fatalf("b restored after %d fast samples (want 1..25)", n)
	}
	l.observe("x", math.NaN())
	l.observe("x", math.Inf(1))
	l.observe("x", -1)
	if l.rails["x"] != nil {
		t.Fatal("bad samples recorded")
	}
}

func TestRailSlowFactorOption(t *testing.T) {
	for _, tc := range []struct {
		in, want float64
		bad      bool
	}{{0, defaultRailSlowFactor, false}, {-1, 0, false}, {1, 1, false}, {8, 8, false},
		{0.5, 0, true}, {math.NaN(), 0, true}, {math.Inf(1), 0, true}} {
		got, err := railSlowFactor(&Options{RailSlowFactor: tc.in}, errInvalid)
		if tc.bad != (err != nil) || (!tc.bad && got != tc.want) || (tc.bad && !errors.Is(err, errInvalid)) {
			t.Errorf("factor %v: %v, %v", tc.in, got, err)
		}
	}
}

// railOrder end to end over one peer: a slow tier-0 rail goes last and gets every
// railSlowShare-th pick; tier 1 (faster still) is never chosen for latency; with the
// factor off the order stays round robin; peer health stays untouched.
func TestRailOrderLatencyDemotion(t *testing.T) {
	healthy := func(d string) wire.Rail { return wire.Rail{Device: d, Port: 1, Health: fb.RailHealthHealthy} }
	for _, tc := range []struct {
		name   string
		factor float64
		demote bool
	}{{"default factor", 0, true}, {"factor off", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ms := &published{rails: []wire.Rail{healthy("a"), healthy("b"), healthy("c")}}
			reg := prometheus.NewRegistry()
			s, err := New(Options{PoolSize: 16, IOTimeout: 5 * time.Second, Published: ms.get, Registerer: reg, Provider: "soft",
				Devices: []string{"a", "b", "c"}, Tiers: [][]string{{"a", "b"}, {"c"}}, RailProbeInterval: -1, RailSlowFactor: tc.factor})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			h := &testHost{addr: "127.0.0.1:1"}
			p := s.NewPeer(h)
			for range 8 {
				p.railLatencyObserve("a", 100*time.Millisecond, 1)
				p.railLatencyObserve("b", time.Millisecond, 1)
				p.railLatencyObserve("c", time.Microsecond, 1)
			}
			first := map[string]int{}
			const picks = 8 * railSlowShare
			for range picks {
				order, err := p.railOrder()
				if err != nil {
					t.Fatal(err)
				}
				if len(order) != 2 || (order[0] != "a" && order[0] != "b") {
					t.Fatalf("order %q: want tier 0 only", order)
				}
				first[order[0]]++
				if tc.demote && order[0] == "b" && order[1] != "a" {
					t.Fatalf("order %q", order)
				}
			}
			if tc.demote {
				if first["a"] != picks/railSlowShare {
					t.Fatalf("slow rail a first %d times in %d picks, want %d", first["a"], picks, picks/railSlowShare)
				}
				if n := railSeries(t, reg, "dfkv_rdma_client_rail_latency_demotions_total", "a"); n != 1 {
					t.Fatalf("%v demotions of a", n)
				}
				// a speeds up: its EWMA comes down and the demotion ends.
				for range 20 {
					p.railLatencyObserve("a", time.Millisecond, 1)
				}
				if _, err := p.railOrder(); err != nil {
					t.Fatal(err)
				}
				if n := railSeries(t, reg, "dfkv_rdma_client_rail_latency_restores_total", "a"); n != 1 {
					t.Fatalf("%v restores of a", n)
				}
			} else if first["a"] != picks/2 {
				t.Fatalf("factor off: a first %d of %d picks (want round robin)", first["a"], picks)
			}
			if h.failed.Load() != 0 || h.healthy.Load() != 0 {
				t.Fatal("latency changed the peer's health")
			}
		})
	}
}

// railSeries reads one rail's counter from reg (0 when not exported yet).
func railSeries(t *testing.T, reg *prometheus.Registry, name, rail string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if railLabel(m) == rail {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func railLabel(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "rail" {
			return l.GetValue()
		}
	}
	return ""
}
