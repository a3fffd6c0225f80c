//go:build linux

// Command dfkv_cluster runs a whole dfkv cluster on one machine, on loopback only
// (127.0.0.1), and measures it: a three-member etcd (Debian's etcd-server binary), MDS
// replicas with their default configuration, N real dfkv_server processes (slab engine,
// small caps, GOMAXPROCS=1) and M simulated clients in this process. Every run is bounded
// in time (--max-time) and count, and leaves nothing running (children die with it).
//
//	dfkv_cluster membership --nodes 8 --clients 50 --rounds 3
//	dfkv_cluster rolling --nodes 8 --keys 20000
//
// membership measures, for every join (a new node registers), drain (SIGTERM: the node
// deregisters) and death (SIGKILL: its lease expires), the time until each client has the
// new ring: "delivered" over all M light clients (they speak the MDS protocol exactly like
// the library, without building rings), "routed" over the --full library clients
// (client.MDSMembership, sampled every 2 ms). It also reports the MDS replicas' CPU and the
// clients' MDS bytes per client per minute over an idle window, the HLT1 topology size,
// and each node's request and byte counters.
//
// rolling restarts every node one after another under a read load that rewrites its
// misses (rolling.go) and reports wrong bytes (must be 0) and how soon the hit ratio is back
// to 95% of its level before.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	binDir, etcdBin, dir, group, nodeCap string
	nodes, clients, full, rounds, par    int
	idle, maxTime, longPoll              time.Duration
	jsonOut, keep                        bool
	// nodeArgs are appended to every node's flags (replay --hot: --hot-spread ...).
	nodeArgs []string
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "rolling" {
		return rollingMain(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "replay" {
		return replayMain(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "partition" {
		return partitionMain(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "membership" {
		fmt.Fprintln(stderr, "usage: dfkv_cluster membership|rolling|partition|replay [flags]   (see -h)")
		return 2
	}
	o := options{}
	fs := o.modeFlags("membership", stderr, 15*time.Minute)
	fs.IntVar(&o.clients, "clients", 50, "simulated registered clients (light: protocol only)")
	fs.IntVar(&o.full, "full", 10, "library clients (client.MDSMembership, building rings) among them")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of join, drain, death (and rejoin of the dead node)")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "idle window for MDS CPU and client bytes")
	fs.DurationVar(&o.longPoll, "long-poll", 10*time.Second, "light clients' long-poll wait (the library default)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if o.nodes < 2 || o.clients < 1 || o.full < 0 || o.full > o.clients || o.rounds < 1 {
		fmt.Fprintln(stderr, "dfkv_cluster: want --nodes >= 2, --clients >= 1, 0 <= --full <= --clients, --rounds >= 1")
		return 2
	}
	return runBounded(o, stderr, func(ctx context.Context, log *slog.Logger) error {
		rep, err := membership(ctx, o, log)
		if err != nil {
			return err
		}
		if o.jsonOut {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}
		rep.print(stdout)
		return nil
	})
}

// eventResult is one membership change as the clients saw it.
type eventResult struct {
	Kind, Node string
	Delivered  []time.Duration // per light client
	Routed     []time.Duration // per full client
	// AtMDS is when a direct MDS read first showed the change, from the change (0 for a
	// join, which counts from there): a drain's or death's path to the MDS (deregistration
	// or lease expiry, the etcd write, the watch) apart from the fan-out to the clients.
	AtMDS time.Duration
}

type report struct {
	Nodes, Clients, Full, Registered int
	TopologyBytes                    int
	Events                           []eventResult
	IdleWindow                       time.Duration
	MDSCPUIdle, MDSCPUEvents         time.Duration
	MDSCPUBaseline                   time.Duration // same window, nodes but no clients
	EventsWindow                     time.Duration
	ClientBytesIdle                  int64
	Load                             []nodeLoad
}

func membership(ctx context.Context, o options, log *slog.Logger) (*report, error) {
	c, ids, stop, err := bringUp(ctx, o, 0, log)
	if err != nil {
		return nil, err
	}
	defer stop()
	// Baseline: the replicas' own CPU (etcd probes, gauges) with the nodes and no clients.
	cpuB := c.mdsCPU()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(o.idle):
	}
	baseline := c.mdsCPU() - cpuB
	f, err := startFleet(c.mdsEP, o.group, o.clients, o.full, o.longPoll)
	if err != nil {
		return nil, err
	}
	defer f.stop()
	rep := &report{Nodes: o.nodes, Clients: o.clients, Full: o.full, MDSCPUBaseline: baseline}
	topo, err := c.topology(ctx)
	if err != nil {
		return nil, err
	}
	rep.TopologyBytes = len(wire.EncodeMdsResponse(topo))
	if err := waitSettled(ctx, f, topo.Topology.MembersEpoch, time.Time{}, 60*time.Second); err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, 60*time.Second, 100*time.Millisecond, "every client registered", func() bool { return f.registered() == o.clients }); err != nil {
		return nil, err
	}
	rep.Registered = f.registered()
	log.Info("clients follow the ring", "clients", o.clients, "full", o.full, "topology_bytes", rep.TopologyBytes)

	// Idle window: what following the ring costs when nothing changes.
	cpu0, b0 := c.mdsCPU(), f.bytes.Load()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(o.idle):
	}
	rep.IdleWindow, rep.MDSCPUIdle, rep.ClientBytesIdle = o.idle, c.mdsCPU()-cpu0, f.bytes.Load()-b0

	cpu0, e0 := c.mdsCPU(), time.Now()
	rng := rand.New(rand.NewPCG(uint64(o.nodes), uint64(o.clients)))
	for r := 0; r < o.rounds; r++ {
		joinID := fmt.Sprintf("j%03d", r)
		// Join: from the moment the MDS answers with the new member.
		ev, err := join(ctx, c, f, joinID)
		if err != nil {
			return nil, err
		}
		rep.Events = append(rep.Events, ev)
		log.Info("join", "node", joinID, "delivered_max", maxDur(ev.Delivered), "routed_max", maxDur(ev.Routed))

		at := time.Now()
		go func() { _ = c.node(joinID).proc.signal(syscall.SIGTERM, 30*time.Second) }()
		if ev, err = measure(ctx, c, f, "drain", joinID, at, false, func(m map[string]bool) bool { return !m[joinID] }); err != nil {
			return nil, err
		}
		rep.Events = append(rep.Events, ev)
		log.Info("drain", "node", joinID, "delivered_max", maxDur(ev.Delivered), "routed_max", maxDur(ev.Routed))

		victim := ids[rng.IntN(len(ids))]
		at = time.Now()
		_ = c.node(victim).proc.signal(syscall.SIGKILL, 10*time.Second)
		if ev, err = measure(ctx, c, f, "death", victim, at, false, func(m map[string]bool) bool { return !m[victim] }); err != nil {
			return nil, err
		}
		rep.Events = append(rep.Events, ev)
		log.Info("death", "node", victim, "delivered_max", maxDur(ev.Delivered), "routed_max", maxDur(ev.Routed))

		if ev, err = join(ctx, c, f, victim); err != nil { // back, same id and data
			return nil, err
		}
		rep.Events = append(rep.Events, ev)
	}
	rep.EventsWindow, rep.MDSCPUEvents = time.Since(e0), c.mdsCPU()-cpu0
	rep.Load = c.nodeLoad()
	return rep, nil
}

// join starts (or restarts) a node and measures its join, polling the MDS while it starts.
func join(ctx context.Context, c *cluster, f *fleet, id string) (eventResult, error) {
	errc := make(chan error, 1)
	go func() { _, err := c.startNode(ctx, id); errc <- err }()
	ev, err := measure(ctx, c, f, "join", id, time.Now(), true, func(m map[string]bool) bool { return m[id] })
	if serr := <-errc; serr != nil {
		return ev, serr
	}
	return ev, err
}

// measure waits until the MDS shows the change (cond over the member ids), then until every
// client has its MembersEpoch. begin is when the harness made the change; latencies count
// from there, or, with fromMDS (a join, whose start includes the process's), from the first
// direct MDS read that shows it (read every 5 ms: up to a few ms late, so a join's figures
// can be a few ms short; a client ahead of that read counts 0).
func measure(ctx context.Context, c *cluster, f *fleet, kind, id string, begin time.Time, fromMDS bool, cond func(map[string]bool) bool) (eventResult, error) {
	var epoch uint64
	err := waitUntil(ctx, 60*time.Second, 5*time.Millisecond, kind+" of "+id+" at the MDS", func() bool {
		resp, err := c.topology(ctx)
		if err != nil || !cond(memberIDs(resp.Topology)) {
			return false
		}
		epoch = resp.Topology.MembersEpoch
		return true
	})
	if err != nil {
		return eventResult{}, err
	}
	start, atMDS := begin, time.Since(begin)
	if fromMDS {
		start, atMDS = time.Now(), 0
	}
	if err := waitSettled(ctx, f, epoch, begin, 60*time.Second); err != nil {
		return eventResult{}, fmt.Errorf("%s of %s: %w", kind, id, err)
	}
	ev := eventResult{Kind: kind, Node: id, AtMDS: atMDS}
	for _, l := range f.light {
		t, _ := l.seen(epoch, begin)
		ev.Delivered = append(ev.Delivered, max(t.Sub(start), 0))
	}
	for i := range f.full {
		t, _ := f.fullSeenAt(i, epoch, begin)
		ev.Routed = append(ev.Routed, max(t.Sub(start), 0))
	}
	return ev, nil
}

// waitSettled waits until every client has moved to epoch since begin.
func waitSettled(ctx context.Context, f *fleet, epoch uint64, begin time.Time, bound time.Duration) error {
	return waitUntil(ctx, bound, 5*time.Millisecond, "every client on the new ring", func() bool {
		for _, l := range f.light {
			if _, ok := l.seen(epoch, begin); !ok {
				return false
			}
		}
		for i := range f.full {
			if _, ok := f.fullSeenAt(i, epoch, begin); !ok {
				return false
			}
		}
		return true
	})
}

func maxDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds).Round(time.Millisecond)
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i].Round(time.Millisecond)
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "cluster: %d nodes, %d registered clients (%d library clients), 3 etcd members, 2 MDS replicas (defaults)\n", r.Nodes, r.Registered, r.Full)
	fmt.Fprintf(w, "HLT1 topology reply: %d bytes at %d members\n", r.TopologyBytes, r.Nodes)
	kinds := []string{"join", "drain", "death"}
	fmt.Fprintf(w, "%-6s %6s | %-34s | %-34s\n", "change", "events", "delivered to every client: p50 p99 max (per client)", "library clients routing: p50 p99 max")
	for _, k := range kinds {
		var del, rou, allDel, atMDS []time.Duration
		n := 0
		for _, e := range r.Events {
			if e.Kind != k {
				continue
			}
			n++
			del = append(del, e.Delivered...)
			rou = append(rou, e.Routed...)
			allDel = append(allDel, slices.Max(e.Delivered))
			atMDS = append(atMDS, e.AtMDS)
		}
		if n == 0 {
			continue
		}
		fmt.Fprintf(w, "%-6s %6d | %8v %8v %8v | %8v %8v %8v   (slowest client per event: p50 %v, max %v)\n", k, n,
			pct(del, .5), pct(del, .99), maxDur(del), pct(rou, .5), pct(rou, .99), maxDur(rou), pct(allDel, .5), maxDur(allDel))
		if k != "join" {
			fmt.Fprintf(w, "%-6s        | at the MDS (a direct read shows it): p50 %v max %v\n", k, pct(atMDS, .5), maxDur(atMDS))
		}
	}
	perMin := func(d time.Duration, win time.Duration) float64 { return d.Seconds() / win.Minutes() }
	fmt.Fprintf(w, "MDS CPU (both replicas), idle %v: %.2f CPU-s/min with the clients, %.2f without; the clients' share %.3f CPU-s/min per 1,000 clients\n", r.IdleWindow,
		perMin(r.MDSCPUIdle, r.IdleWindow), perMin(r.MDSCPUBaseline, r.IdleWindow), perMin(r.MDSCPUIdle-r.MDSCPUBaseline, r.IdleWindow)*1000/float64(r.Clients))
	fmt.Fprintf(w, "MDS CPU (both replicas), during the %d changes (%v): %.2f CPU-s/min\n", len(r.Events), r.EventsWindow.Round(time.Second),
		perMin(r.MDSCPUEvents, r.EventsWindow))
	fmt.Fprintf(w, "client MDS traffic, idle: %.0f bytes per client per minute (both directions, long polls + heartbeats)\n",
		float64(r.ClientBytesIdle)/float64(r.Clients)/r.IdleWindow.Minutes())
	var reqs []float64
	for _, l := range r.Load {
		reqs = append(reqs, l.Requests)
	}
	sort.Float64s(reqs)
	if len(reqs) > 0 {
		fmt.Fprintf(w, "per-node requests served: min %.0f max %.0f over %d nodes (%s)\n", reqs[0], reqs[len(reqs)-1], len(reqs), strings.Join(loadHead(r.Load, 4), ", "))
	}
}

func loadHead(ls []nodeLoad, n int) []string {
	var out []string
	for i, l := range ls {
		if i == n {
			out = append(out, "...")
			break
		}
		out = append(out, fmt.Sprintf("%s %.0f req %.0f B out", l.ID, l.Requests, l.SentBytes))
	}
	return out
}
