//go:build linux

package main

import "testing"

func TestDialableEndpoint(t *testing.T) {
	for _, c := range []struct{ ep, override, fallback, want string }{
		{"tcp://0.0.0.0:5557", "", "10.0.0.7", "tcp://10.0.0.7:5557"},
		{"tcp://[::]:5557", "", "node1.example", "tcp://node1.example:5557"},
		{"tcp://0.0.0.0:5557", "", "", "tcp://0.0.0.0:5557"}, // nothing better known
		{"tcp://10.0.0.5:5557", "", "10.0.0.7", "tcp://10.0.0.5:5557"},
		{"tcp://0.0.0.0:5557", "router.lan", "10.0.0.7", "tcp://router.lan:5557"},
		{"tcp://10.0.0.5:5557", "fd00::1", "", "tcp://[fd00::1]:5557"},
	} {
		if got := dialable(c.ep, c.override, c.fallback); got != c.want {
			t.Errorf("dialable(%q, %q, %q) = %q, want %q", c.ep, c.override, c.fallback, got, c.want)
		}
	}
}

func TestEventNode(t *testing.T) {
	for _, c := range []struct {
		node, advert, bound, want string
	}{
		{"", "", "127.0.0.1:4000", "127.0.0.1:4000"},
		{"", "10.0.0.7:0", "0.0.0.0:4000", "10.0.0.7:4000"},
		{"", "10.0.0.7:12000", "0.0.0.0:4000", "10.0.0.7:12000"},
		{"pod-a", "10.0.0.7:0", "0.0.0.0:4000", "pod-a"},
	} {
		if got := eventNode(eventOptions{node: c.node}, c.advert, c.bound); got != c.want {
			t.Errorf("eventNode(%q, %q, %q) = %q, want %q", c.node, c.advert, c.bound, got, c.want)
		}
	}
}

func TestEventAdvertiseFlag(t *testing.T) {
	for _, c := range []struct {
		host string
		ok   bool
	}{
		{"10.0.0.7", true}, {"node1.example", true}, {"fd00::1", true},
		{"10.0.0.7:5557", false}, {"tcp://10.0.0.7", false}, {"0.0.0.0", false}, {"::", false},
	} {
		o := eventOptions{endpoint: "tcp://0.0.0.0:5557", layout: "map", queue: 1, buffer: 1, advertise: c.host}
		if err := o.validate(); (err == nil) != c.ok {
			t.Errorf("--kv-events-advertise %q: err = %v, want ok=%v", c.host, err, c.ok)
		}
	}
}
