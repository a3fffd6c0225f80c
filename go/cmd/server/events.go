//go:build linux

package main

import (
	"flag"
	"fmt"
	"log/slog"
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
	endpoint, replay, topic, medium, layout, node string
	queue, buffer                                 int
}

func addEventFlags(fs *flag.FlagSet, o *eventOptions) {
	fs.StringVar(&o.endpoint, "kv-events", "", "publish KV events (vLLM's ZMQ/msgpack format) on this PUB endpoint, tcp://HOST:PORT (off by default)")
	fs.StringVar(&o.replay, "kv-events-replay", "", "with --kv-events: serve replay requests (ROUTER, as vLLM's) on tcp://HOST:PORT")
	fs.StringVar(&o.topic, "kv-events-topic", kvevents.DefaultTopic, "ZMQ topic of event batches; {node} and {model} are replaced (llm-d reads kv@<pod>@<model>)")
	fs.StringVar(&o.medium, "kv-events-medium", kvevents.DefaultMedium, "tier named in the events' medium field")
	fs.StringVar(&o.layout, "kv-events-layout", "map", "msgpack layout: array (every struct positional, older vLLM), map (events as tagged maps in a positional batch, vLLM 0.33) or map-all (the batch a map too)")
	fs.StringVar(&o.node, "kv-events-node", "", "the {node} of --kv-events-topic (default: the data address)")
	fs.IntVar(&o.queue, "kv-events-queue", kvevents.DefaultQueue, "events waiting to be published; past it events are dropped (counted, a gap in the sequence)")
	fs.IntVar(&o.buffer, "kv-events-buffer", kvevents.DefaultBuffer, "batches kept for replay")
}

func (o *eventOptions) validate() error {
	if o.endpoint == "" {
		if o.replay != "" {
			return fmt.Errorf("--kv-events-replay needs --kv-events")
		}
		return nil
	}
	if _, err := kvevents.ParseLayout(o.layout); err != nil {
		return fmt.Errorf("--kv-events-layout: %w", err)
	}
	if o.queue < 1 || o.buffer < 1 {
		return fmt.Errorf("--kv-events-queue and --kv-events-buffer must be positive")
	}
	for _, ep := range []string{o.endpoint, o.replay} {
		if ep != "" && !strings.HasPrefix(ep, "tcp://") {
			return fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT", ep)
		}
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
	if o.node == "" {
		o.node = node
	}
	pub, err := kvevents.New(kvevents.Config{
		Endpoint: o.endpoint, ReplayEndpoint: o.replay, Topic: o.topic, Node: o.node, Medium: o.medium,
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

// eventMemberConfig is what a node with KV events adds to its MDS registration.
func eventMemberConfig(pub *kvevents.Publisher) []wire.KV {
	kv := []wire.KV{{Key: wire.MemberKVEventsKey, Value: pub.Addr()}}
	if r := pub.ReplayAddr(); r != "" {
		kv = append(kv, wire.KV{Key: wire.MemberKVReplayKey, Value: r})
	}
	return kv
}
