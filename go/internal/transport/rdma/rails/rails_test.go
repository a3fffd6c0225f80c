package rails

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func TestParseTiers(t *testing.T) {
	devs := []string{"mlx5_0", "mlx5_1", "mlx5_2"}
	tests := []struct {
		spec string
		devs []string
		want map[string]uint8
		err  string
	}{
		{"", devs, map[string]uint8{"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 0}, ""},
		{"mlx5_0,mlx5_1;mlx5_2", devs, map[string]uint8{"mlx5_0": 0, "mlx5_1": 0, "mlx5_2": 1}, ""},
		{"mlx5_2 ; mlx5_0|mlx5_1", devs, map[string]uint8{"mlx5_0": 1, "mlx5_1": 1, "mlx5_2": 0}, ""},
		{"mlx5_0;mlx5_1;mlx5_2", devs, map[string]uint8{"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 2}, ""},
		{"mlx5_0,mlx5_9;mlx5_2", devs, nil, `device "mlx5_9" is not in --rdma-dev`},
		{"mlx5_0,mlx5_1", devs, nil, "leaves out mlx5_2"},
		{"mlx5_0;;mlx5_1,mlx5_2", devs, nil, "tier 1 is empty"},
		{"mlx5_0,mlx5_0;mlx5_1,mlx5_2", devs, nil, "in two places"},
		{"mlx5_0", nil, nil, "needs an explicit --rdma-dev"},
		{"mlx5 0;mlx5_1", devs, nil, "printable ASCII"},
	}
	for _, tt := range tests {
		got, err := ParseTiers(tt.spec, tt.devs)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, ErrConfig) {
				t.Errorf("%q: %v, want %q", tt.spec, err, tt.err)
			}
			continue
		}
		if err != nil || !cmp.Equal(got, tt.want) {
			t.Errorf("%q: %v %v", tt.spec, got, err)
		}
	}
}

func TestParseListPlanServeOrder(t *testing.T) {
	if l, err := ParseList(" soft0, soft1 ,,"); err != nil || !slices.Equal(l, []string{"soft0", "soft1"}) {
		t.Fatalf("%v %v", l, err)
	}
	for _, bad := range []string{"soft0,soft0", "a;b", "x|y", strings.Repeat("d", 65)} {
		if _, err := ParseList(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	devs := []string{"a", "b", "c", "d"}
	specs, err := Plan(devs, "c;a,d;b", "d")
	if err != nil {
		t.Fatal(err)
	}
	want := []Spec{{"a", 1}, {"b", 2}, {"c", 0}, {"d", 1}}
	if !cmp.Equal(specs, want) {
		t.Fatalf("plan %v", specs)
	}
	if got := ServeOrder(specs, "d"); !slices.Equal(got, []string{"d", "c", "a", "b"}) {
		t.Fatalf("serve order %v", got)
	}
	if got := ServeOrder(specs, ""); !slices.Equal(got, []string{"c", "a", "d", "b"}) {
		t.Fatalf("serve order %v", got)
	}
	if _, err := Plan(devs, "", "e"); err == nil || !strings.Contains(err.Error(), `--rdma-primary-dev "e" is not in --rdma-dev`) {
		t.Fatalf("primary outside the list: %v", err)
	}
	if _, err := Plan(nil, "", "e"); err != nil {
		t.Fatalf("primary without a list: %v", err)
	}
}

func softWithFaults(t *testing.T, devices int) (*soft.Provider, func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "faults")
	p, err := soft.New(soft.Options{Devices: devices, FaultFile: path})
	if err != nil {
		t.Fatal(err)
	}
	return p, func(s string) {
		t.Helper()
		if err := soft.WriteFaults(path, s); err != nil {
			t.Fatal(err)
		}
	}
}

type railView struct {
	health   fb.RailHealth
	gen      uint32
	port     uint8
	queryOK  bool
	tier     uint8
	physUp   bool
	portDown bool
}

func view(rs []wire.Rail) map[string]railView {
	out := map[string]railView{}
	for _, r := range rs {
		out[r.Device] = railView{r.Health, r.Generation, r.PortState, r.QueryOK, r.Tier, r.PhysState == 5, r.PortState == 1}
	}
	return out
}

func TestMonitorHealthMachine(t *testing.T) {
	p, set := softWithFaults(t, 2)
	m, err := NewMonitor(Config{Provider: p, Rails: []Spec{{"soft0", 0}, {"soft1", 1}}, RecoverySamples: 2})
	if err != nil {
		t.Fatal(err)
	}
	healthy := func(gen uint32, tier uint8) railView {
		return railView{fb.RailHealthHealthy, gen, 4, true, tier, true, false}
	}
	down := func(gen uint32) railView { return railView{fb.RailHealthDown, gen, 1, true, 1, false, true} }
	steps := []struct {
		name    string
		faults  string
		changed bool
		soft1   railView
	}{
		{"start", "", false, healthy(1, 1)},
		{"same", "", false, healthy(1, 1)},
		{"port down", "soft1 port down\n", true, down(2)},
		{"still down", "soft1 port down\n", false, down(2)},
		{"port up: quarantined", "", true, railView{fb.RailHealthQuarantined, 3, 4, true, 1, true, false}},
		{"second healthy sample", "", true, healthy(4, 1)},
		{"flap down", "soft1 port down\n", true, down(5)},
		{"up", "", true, railView{fb.RailHealthQuarantined, 6, 4, true, 1, true, false}},
		{"down while quarantined", "soft1 port down\n", true, down(7)},
		{"query fails", "soft1 query fail\n", true, railView{fb.RailHealthDown, 7, 0, false, 1, false, false}},
	}
	for _, s := range steps {
		if s.name != "start" {
			set(s.faults)
			if got := m.Sample(); got != s.changed {
				t.Fatalf("%s: changed=%v", s.name, got)
			}
		}
		v := view(m.Rails())
		if v["soft1"] != s.soft1 {
			t.Fatalf("%s: soft1 %+v, want %+v", s.name, v["soft1"], s.soft1)
		}
		if m.Healthy("soft1") != (s.soft1.health == fb.RailHealthHealthy) || !m.Healthy("soft0") || m.Healthy("mlx5_0") {
			t.Fatalf("%s: Healthy() disagrees with the published rails", s.name)
		}
		if v["soft0"] != healthy(1, 0) {
			t.Fatalf("%s: soft0 moved: %+v", s.name, v["soft0"])
		}
	}
	reg := prometheus.NewRegistry()
	m.Register(reg)
	if got := gathered(t, reg); !cmp.Equal(got, map[string]float64{
		"dfkv_server_rdma_rails_configured": 2, "dfkv_server_rdma_rails_active": 1,
		"dfkv_rdma_rail_healthy/soft0": 1, "dfkv_rdma_rail_healthy/soft1": 0,
		"dfkv_rdma_rail_health_changes_total/soft0": 0, "dfkv_rdma_rail_health_changes_total/soft1": 6,
	}) {
		t.Fatalf("metrics %v", got)
	}
}

// gathered flattens a registry into name[/rail] -> value.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range mm.GetLabel() {
				k += "/" + l.GetValue()
			}
			switch {
			case mm.GetGauge() != nil:
				out[k] = mm.GetGauge().GetValue()
			case mm.GetCounter() != nil:
				out[k] = mm.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestMonitorStartCallsOnChange(t *testing.T) {
	p, set := softWithFaults(t, 2)
	ch := make(chan []wire.Rail, 16)
	m, err := NewMonitor(Config{Provider: p, Rails: []Spec{{"soft0", 0}, {"soft1", 0}}, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(func(rs []wire.Rail) { ch <- rs })
	defer m.Stop()
	set("soft0 port down\n")
	select {
	case rs := <-ch:
		if rs[0].Device != "soft0" || rs[0].Health != fb.RailHealthDown || rs[0].State() != "down" || rs[1].Health != fb.RailHealthHealthy {
			t.Fatalf("%+v", rs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no change reported for a downed port")
	}
	m.Stop()
	m.Stop() // idempotent
}

func TestMonitorConfigErrors(t *testing.T) {
	p, _ := softWithFaults(t, 1)
	if _, err := NewMonitor(Config{Provider: p}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no rails: %v", err)
	}
	if _, err := NewMonitor(Config{Rails: []Spec{{"soft0", 0}}}); err == nil {
		t.Fatal("no provider accepted")
	}
	// A configured device the provider does not have is published, Down and unqueried.
	m, err := NewMonitor(Config{Provider: p, Rails: []Spec{{"soft0", 0}, {"mlx5_0", 0}}})
	if err != nil {
		t.Fatal(err)
	}
	rs := m.Rails()
	if rs[1].QueryOK || rs[1].Health != fb.RailHealthDown || rs[0].Health != fb.RailHealthHealthy || rs[0].Port != 1 {
		t.Fatalf("%+v", rs)
	}
}
