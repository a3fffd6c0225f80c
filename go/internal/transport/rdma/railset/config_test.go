package railset

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func TestRailCandidates(t *testing.T) {
	healthy := func(d string, tier uint8) wire.Rail {
		return wire.Rail{Device: d, Tier: tier, Health: fb.RailHealthHealthy, QueryOK: true, PortState: 4}
	}
	down := func(d string, tier uint8) wire.Rail {
		return wire.Rail{Device: d, Tier: tier, Health: fb.RailHealthDown, QueryOK: true, PortState: 1}
	}
	all := func(string) bool { return true }
	not := func(q string) func(string) bool { return func(d string) bool { return d != q } }
	for _, tc := range []struct {
		name      string
		opts      Options
		published []wire.Rail
		usable    func(string) bool
		want      []string
		wantErr   error
	}{
		{name: "no whitelist keeps one device", opts: Options{}, published: []wire.Rail{healthy("a", 0)}, usable: all},
		{name: "static: whitelist, no tiers", opts: Options{Devices: []string{"a", "b"}}, usable: all, want: []string{"a", "b"}},
		{name: "static: tiers fail closed", opts: Options{Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}, {"b"}}}, usable: all, wantErr: ErrNoCompatibleRail},
		{name: "tier 0 both healthy", opts: Options{Devices: []string{"a", "b"}}, published: []wire.Rail{healthy("a", 0), healthy("b", 0)}, usable: all, want: []string{"a", "b"}},
		{name: "primary first", opts: Options{Devices: []string{"a", "b"}, Primary: "b"}, published: []wire.Rail{healthy("a", 0), healthy("b", 0)}, usable: all, want: []string{"b", "a"}},
		{name: "client tiers: tier 0 only", opts: Options{Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}, {"b"}}}, published: []wire.Rail{healthy("a", 0), healthy("b", 0)}, usable: all, want: []string{"a"}},
		{name: "client tiers: tier 0 down", opts: Options{Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}, {"b"}}}, published: []wire.Rail{down("a", 0), healthy("b", 0)}, usable: all, want: []string{"b"}},
		{name: "client tiers: tier 0 quarantined", opts: Options{Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}, {"b"}}}, published: []wire.Rail{healthy("a", 0), healthy("b", 0)}, usable: not("a"), want: []string{"b"}},
		{name: "member tiers", opts: Options{Devices: []string{"a", "b", "c"}}, published: []wire.Rail{healthy("a", 1), healthy("b", 0), healthy("c", 0)}, usable: all, want: []string{"b", "c"}},
		{name: "whitelist outside published", opts: Options{Devices: []string{"x"}}, published: []wire.Rail{healthy("a", 0)}, usable: all, wantErr: ErrNoCompatibleRail},
		{name: "all published down", opts: Options{Devices: []string{"a"}}, published: []wire.Rail{down("a", 0)}, usable: all, wantErr: ErrNoCompatibleRail},
		{name: "legacy record judged by port", opts: Options{Devices: []string{"a"}}, published: []wire.Rail{{Device: "a", QueryOK: true, PortState: 4}}, usable: all, want: []string{"a"}},
		{name: "static: all quarantined", opts: Options{Devices: []string{"a"}}, usable: not("a"), wantErr: ErrNoCompatibleRail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := newRailConfig(&tc.opts, errInvalid)
			if err != nil {
				t.Fatal(err)
			}
			got, err := rc.candidates(tc.published, tc.usable)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("candidates (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRailConfigRefused(t *testing.T) {
	for _, o := range []Options{
		{Devices: []string{"a", "a"}},
		{Devices: []string{"a", ""}},
		{Tiers: [][]string{{"a"}}},
		{Devices: []string{"a", "b"}, Tiers: [][]string{{"a"}}},
		{Devices: []string{"a"}, Tiers: [][]string{{"a"}, {}}},
		{Devices: []string{"a"}, Tiers: [][]string{{"a", "x"}}},
		{Devices: []string{"a"}, Tiers: [][]string{{"a"}, {"a"}}},
		{Devices: []string{"a"}, Primary: "b"},
	} {
		if _, err := newRailConfig(&o, errInvalid); !errors.Is(err, errInvalid) {
			t.Errorf("%+v: err %v, want ErrInvalid", o, err)
		}
	}
}

// The caller's sentinels as the tests pass them (go/client passes its own).
var (
	errInvalid = errors.New("invalid")
	errTimeout = errors.New("timeout")
)
