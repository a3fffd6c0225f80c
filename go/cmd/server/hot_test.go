//go:build linux

package main

import (
	"strings"
	"testing"
)

func TestHotFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string // "" = accepted
	}{
		{nil, ""},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1,b=127.0.0.1:2"}, ""},
		{[]string{"--hot-spread", "--mds", "127.0.0.1:9", "--id", "a", "--advertise", "127.0.0.1:0"}, ""},
		{[]string{"--hot-spread"}, "needs the ring"},
		{[]string{"--hot-spread", "--hot-members", "a=nope"}, "--hot-members"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-max-replicas", "128"}, "--hot-max-replicas"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-max-replicas", "0"}, "--hot-max-replicas"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-max-replicas", "127"}, ""},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-share", "0"}, "--hot-share"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-lease", "10ms"}, "--hot-lease"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--hot-interval", "5s"}, "--hot-interval"},
		{[]string{"--hot-spread", "--hot-members", "a=127.0.0.1:1", "--rdma"}, "--rdma"},
	} {
		_, err := parse(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v, want accepted", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.err)
		}
	}
}
