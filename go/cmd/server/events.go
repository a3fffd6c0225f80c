//go:build linux

package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/kvevents"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/internal/store/tagged"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// eventOptions are the KV-event flags (docs/EVENTS.md).
type eventOptions struct {
	endpoint, replay, topic, medium, layout, node, advertise, connect string
	queue, buffer                                                     int
}

func addEventFlags(fs *flag.FlagSet, o *eventOptions) {
	fs.StringVar(&o.endpoint, "kv-events", "", "publish KV events (vLLM's ZMQ/msgpack format) on this PUB endpoint, tcp://HOST:PORT (off by default)")
	fs.StringVar(&o.replay, "kv-events-replay", "", "with --kv-events: serve replay requests (ROUTER, as vLLM's) on tcp://HOST:PORT")
	fs.StringVar(&o.connect, "kv-events-connect", "", "with --kv-events: also dial these subscribers that bind, tcp://HOST:PORT[,...] (llm-d's indexer binds its SUB on tcp://*:5557)")
	fs.StringVar(&o.topic, "kv-events-topic", kvevents.DefaultTopic, "ZMQ topic of event batches; {node} and {model} are replaced (llm-d reads kv@<pod>@<model>)")
	fs.StringVar(&o.medium, "kv-events-medium", kvevents.DefaultMedium, "tier named in the events' medium field")
	fs.StringVar(&o.layout, "kv-events-layout", "map", "msgpack layout: array (every struct positional, older vLLM), map (events as tagged maps in a positional batch, vLLM 0.33) or map-all (the batch a map too)")
	fs.StringVar(&o.node, "kv-events-node", "", "the {node} of --kv-events-topic (default: --advertise, else the bound data address)")
	fs.StringVar(&o.advertise, "kv-events-advertise", "", "host routers dial for the KV-event endpoints in the MDS topology (default: their bound host, or --advertise's host when bound to 0.0.0.0 or ::)")
	fs.IntVar(&o.queue, "kv-events-queue", kvevents.DefaultQueue, "events waiting to be published; past it events are dropped (counted, a gap in the sequence)")
	fs.IntVar(&o.buffer, "kv-events-buffer", kvevents.DefaultBuffer, "batches kept for replay")
}

func (o *eventOptions) connectList() []string {
	var out []string
	for _, ep := range strings.Split(o.connect, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

func (o *eventOptions) validate() error {
	if o.endpoint == "" {
		if o.replay != "" || o.connect != "" {
			return fmt.Errorf("--kv-events-replay and --kv-events-connect need --kv-events")
		}
		return nil
	}
	if _, err := kvevents.ParseLayout(o.layout); err != nil {
		return fmt.Errorf("--kv-events-layout: %w", err)
	}
	if o.queue < 1 || o.buffer < 1 {
		return fmt.Errorf("--kv-events-queue and --kv-events-buffer must be positive")
	}
	for _, ep := range append([]string{o.endpoint, o.replay}, o.connectList()...) {
		if ep != "" && !strings.HasPrefix(ep, "tcp://") {
			return fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT", ep)
		}
	}
	if h := o.advertise; h != "" && (strings.Contains(h, "/") || (strings.Contains(h, ":") && net.ParseIP(h) == nil) || unspecifiedHost(h)) {
		return fmt.Errorf("--kv-events-advertise %q: want a host or IP address routers can dial (no port, not 0.0.0.0 or ::)", h)
	}
	return nil
}

// freshStart reports whether the node starts without (some of) its data: a
// non-persistent engine, or a data directory that was never formatted (new, wiped or a
// replaced disk). Subscribers are then told AllBlocksCleared.
func freshStart(kind string, dirs []string) bool {
	switch kind {
	case "mem":
		return true
	case "slab":
		for _, d := range dirs {
			if _, _, ok, err := slab.Formatted(d); err == nil && !ok {
				return true
			}
		}
	default:
		for _, d := range dirs {
			if ents, err := os.ReadDir(d); err != nil || len(ents) == 0 {
				return true
			}
		}
	}
	return false
}

// startEvents binds the publisher; the returned wrap keeps tags beside the engine.
func startEvents(o eventOptions, node string, fresh bool, dir string, reg prometheus.Registerer, log *slog.Logger) (*kvevents.Publisher, func(store.Engine) (store.Engine, error), error) {
	layout, _ := kvevents.ParseLayout(o.layout)
	pub, err := kvevents.New(kvevents.Config{
		Endpoint: o.endpoint, ReplayEndpoint: o.replay, Connect: o.connectList(), Topic: o.topic, Node: node, Medium: o.medium,
		Layout: layout, QueueLen: o.queue, Buffer: o.buffer, Logger: log, Registry: reg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("--kv-events: %w", err)
	}
	log.Info("publishing KV events", "endpoint", pub.Addr(), "replay", pub.ReplayAddr(), "layout", layout, "topic", o.topic, "fresh_start", fresh)
	wrap := func(e store.Engine) (store.Engine, error) {
		t, err := tagged.Wrap(e, tagged.Options{Dir: dir, Sink: pub, Fresh: fresh, Logger: log})
		if err != nil {
			return nil, err
		}
		return t, nil
	}
	return pub, wrap, nil
}

// eventNode is the {node} of the topic: --kv-events-node, else the address clients dial
// (--advertise, its port 0 resolved to bound), else the bound data address.
func eventNode(o eventOptions, advert, bound string) string {
	switch {
	case o.node != "":
		return o.node
	case advert != "":
		if host, port, err := net.SplitHostPort(advert); err == nil && port == "0" {
			_, bp, _ := net.SplitHostPort(bound)
			return net.JoinHostPort(host, bp)
		}
		return advert
	}
	return bound
}

// eventMemberConfig is what a node with KV events adds to its MDS registration: the
// endpoints as routers dial them (dialable).
func eventMemberConfig(pub *kvevents.Publisher, o eventOptions, advert string) []wire.KV {
	advHost, _, _ := net.SplitHostPort(advert)
	kv := []wire.KV{{Key: wire.MemberKVEventsKey, Value: dialable(pub.Addr(), o.advertise, advHost)}}
	if r := pub.ReplayAddr(); r != "" {
		kv = append(kv, wire.KV{Key: wire.MemberKVReplayKey, Value: dialable(r, o.advertise, advHost)})
	}
	return kv
}

// dialable is the bound endpoint ep (tcp://host:port) with its host replaced by override,
// or by fallback when ep is bound to an unspecified address (0.0.0.0 or ::): a router
// cannot dial those.
func dialable(ep, override, fallback string) string {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return ep
	}
	switch {
	case override != "":
		host = override
	case unspecifiedHost(host) && fallback != "":
		host = fallback
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

func unspecifiedHost(h string) bool {
	ip := net.ParseIP(h)
	return h == "" || h == "*" || (ip != nil && ip.IsUnspecified())
}
