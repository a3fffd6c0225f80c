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
