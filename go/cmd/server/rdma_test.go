package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// fakeProvider has devices (or not) under a name, for the memlock decision.
type fakeProvider struct {
	name string
	devs []verbs.DeviceInfo
}

func (f fakeProvider) Name() string { return f.name }
func (f fakeProvider) Devices() ([]verbs.DeviceInfo, error) {
	if len(f.devs) == 0 {
		return nil, verbs.ErrNoDevice
	}
	return f.devs, nil
}
func (f fakeProvider) Open(string) (verbs.Context, error) { return nil, verbs.ErrNoDevice }

func TestMemlockVerdict(t *testing.T) {
	small := verbs.MemlockLimit{Cur: 64 << 10, Known: true}
	rxe := []verbs.DeviceInfo{{Name: "rxe0"}}
	cases := []struct {
		name string
		p    verbs.Provider
		l    verbs.MemlockLimit
		fail bool
	}{
		{"ibverbs device, small limit", fakeProvider{"ibverbs", rxe}, small, true},
		{"ibverbs device, enough", fakeProvider{"ibverbs", rxe}, verbs.MemlockLimit{Cur: 1 << 30, Known: true}, false},
		{"ibverbs device, unlimited", fakeProvider{"ibverbs", rxe}, verbs.MemlockLimit{Unlimited: true, Known: true}, false},
		{"ibverbs without a device says that instead", fakeProvider{"ibverbs", nil}, small, false},
		{"soft pins nothing", fakeProvider{"soft", rxe}, small, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := memlockVerdict(tc.p, 256<<20, tc.l)
			if (err != nil) != tc.fail {
				t.Fatalf("err %v, want failure %v", err, tc.fail)
			}
			if err != nil && (!errors.Is(err, verbs.ErrMemlock) || !strings.Contains(err.Error(), "ulimit -l 64") || !strings.Contains(err.Error(), "needs 256 MiB")) {
				t.Fatalf("message %q", err)
			}
		})
	}
}

// --rdma-gid-index / --rdma-hop-limit / --rdma-traffic-class: -1 chooses per connection, an
// index forces it; out-of-range values refuse the start with the flag's name.
func TestGIDPolicyFlags(t *testing.T) {
	o := rdmaOptions{gidIndex: -1, hopLimit: 64}
	if p, err := o.gidPolicy(); err != nil || p.HasIndex || p.HopLimit != 64 || p.TrafficClass != 0 {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	o = rdmaOptions{gidIndex: 0, hopLimit: 8, trafficClass: 106}
	if p, err := o.gidPolicy(); err != nil || !p.HasIndex || p.Index != 0 || p.HopLimit != 8 || p.TrafficClass != 106 {
		t.Fatalf("set: %+v %v", p, err)
	}
	for flag, bad := range map[string]rdmaOptions{
		"--rdma-gid-index":     {gidIndex: 256, hopLimit: 64},
		"--rdma-hop-limit":     {gidIndex: -1, hopLimit: 0},
		"--rdma-traffic-class": {gidIndex: -1, hopLimit: 64, trafficClass: 256},
	} {
		if _, err := bad.gidPolicy(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v", flag, err)
		}
	}
}
