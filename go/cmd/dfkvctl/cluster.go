package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
	"github.com/dfkv/dfkv/go/ring"
)

// clusterCommand reports whether cmd/argv is a cluster view served through the MDS.
func clusterCommand(cmd string, argv []string) bool {
	switch cmd {
	case "ring", "clients", "stats":
		return true
	case "stat":
		for _, a := range argv {
			if a == "--all" || a == "-all" || strings.HasPrefix(a, "--all=") {
				return true
			}
		}
	}
	return false
}

type clusterFlags struct {
	mds, group string
	json, all  bool
	timeout    time.Duration
}

// runCluster runs ring / clients / stats / stat --all. Flags may come before the command
// (global) or after it; DFKV_MDS and DFKV_GROUP are read too.
func runCluster(cmd string, argv []string, g clusterFlags, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkvctl "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.mds, "mds", g.mds, "MDS replicas host:port[,...]")
	fs.StringVar(&g.group, "group", g.group, "MDS group")
	fs.BoolVar(&g.json, "json", g.json, "machine-readable JSON output")
	fs.BoolVar(&g.all, "all", g.all, "stat: every node of the ring plus an aggregate")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "deadline per MDS or node request")
	sec.define(fs)
	if err := fs.Parse(argv); err != nil {
		return exitError
	}
	if err := cli.ApplyEnv(fs); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	if err := sec.load(); err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dfkvctl: %s: unexpected arguments %v\n", cmd, fs.Args())
		return exitError
	}
	eps, err := mdsclient.ParseEndpoints(g.mds)
	if err != nil {
		fmt.Fprintln(stderr, "dfkvctl: --mds:", err)
		return exitError
	}
	rpc, err := mdsclient.New(eps, mdsclient.Options{CallTimeout: g.timeout, TLS: sec.cfg, Token: sec.token})
	if err != nil {
		fmt.Fprintln(stderr, "dfkvctl:", err)
		return exitError
	}
	defer rpc.Close()
	call := func(op fb.MdsOp) (*wire.MdsResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout*time.Duration(len(eps)+1))
		defer cancel()
		resp, _, err := rpc.Call(ctx, &wire.MdsRequest{Op: op, Group: g.group})
		return resp, err
	}
	var out any
	var render func(w io.Writer)
	switch cmd {
	case "ring":
		resp, err := call(fb.MdsOpListTopology)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		rv := ringView(g.group, resp.Topology)
		out, render = rv, rv.render
	case "clients":
		resp, err := call(fb.MdsOpListClients)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		cv := clientsView(g.group, resp.Clients)
		out, render = cv, cv.render
	case "stats", "stat":
		topo, err := call(fb.MdsOpListTopology)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		clients, err := call(fb.MdsOpListClients)
		if err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		sv := statsView(g.group, topo.Topology, len(clients.Clients), g.timeout)
		out = sv
		if cmd == "stats" {
			render = sv.renderTotals
		} else {
			render = sv.renderAll
		}
	}
	if g.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "dfkvctl:", err)
			return exitError
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	render(tw)
	tw.Flush()
	return exitOK
}

type memberRow struct {
	ID       string            `json:"id"`
	Address  string            `json:"address"`
	Weight   uint32            `json:"weight"`
	Eligible bool              `json:"eligible"`
	Share    float64           `json:"share"`
	Version  string            `json:"version"`
	Config   map[string]string `json:"config"`
	Rails    []railRow         `json:"rails,omitempty"`
}

// railRow is one rail as dfkvctl prints it (the shape python/dfkv/topology.py's to_json has).
type railRow struct {
	Device     string `json:"device"`
	Port       uint8  `json:"port"`
	PortState  uint8  `json:"port_state"`
	PhysState  uint8  `json:"phys_state"`
	QueryOK    bool   `json:"query_ok"`
	NUMANode   int16  `json:"numa_node"`
	Tier       uint8  `json:"tier"`
	Generation uint32 `json:"generation"`
	State      string `json:"state"` // healthy, down, quarantined (or up/down/unqueried from older writers)
}

func railRows(rs []wire.Rail) []railRow {
	var out []railRow
	for _, r := range rs {
		out = append(out, railRow{Device: r.Device, Port: r.Port, PortState: r.PortState, PhysState: r.PhysState,
			QueryOK: r.QueryOK, NUMANode: r.NUMANode, Tier: r.Tier, Generation: r.Generation, State: r.State()})
	}
	return out
}

type ringOut struct {
	Group         string      `json:"group"`
	MembersEpoch  string      `json:"members_epoch"`
	TopologyEpoch string      `json:"topology_epoch"`
	Members       []memberRow `json:"members"`
}

func kvMap(kvs []wire.KV) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func ringView(group string, t *wire.Topology) *ringOut {
	out := &ringOut{Group: group, Members: []memberRow{}}
	if t == nil {
		return out
	}
	out.MembersEpoch, out.TopologyEpoch = fmt.Sprintf("%016x", t.MembersEpoch), fmt.Sprintf("%016x", t.TopologyEpoch)
	var nodes []ring.Node
	for _, m := range t.Members {
		if m.Eligible {
			nodes = append(nodes, ring.Node{ID: m.ID, Weight: m.Weight})
		}
	}
	shares := map[string]float64{}
	if r, err := ring.New(nodes); err == nil {
		shares = r.Shares()
	}
	for _, m := range t.Members {
		out.Members = append(out.Members, memberRow{ID: m.ID, Address: m.Addr, Weight: m.Weight, Eligible: m.Eligible,
			Share: shares[m.ID], Version: m.Version, Config: kvMap(m.Config), Rails: railRows(m.Rails)})
	}
	return out
}

func configString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func (r *ringOut) render(w io.Writer) {
	fmt.Fprintf(w, "group %s: %d members (members epoch %s, topology epoch %s)\n", r.Group, len(r.Members), r.MembersEpoch, r.TopologyEpoch)
	fmt.Fprintln(w, "ID\tADDRESS\tWEIGHT\tSHARE\tELIGIBLE\tRAILS\tVERSION\tCONFIG")
	for _, m := range r.Members {
		rails := make([]string, 0, len(m.Rails))
		for _, rl := range m.Rails {
			rails = append(rails, fmt.Sprintf("%s:t%d:%s", rl.Device, rl.Tier, rl.State))
		}
		rs := strings.Join(rails, ",")
		if rs == "" {
			rs = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%.1f%%\t%v\t%s\t%s\t%s\n", m.ID, m.Address, m.Weight, 100*m.Share, m.Eligible, rs, m.Version, configString(m.Config))
	}
}

type clientRow struct {
	ID         string            `json:"id"`
	Hostname   string            `json:"hostname"`
	PID        uint64            `json:"pid"`
	Registered time.Time         `json:"registered"`
	Info       map[string]string `json:"info"`
}

type clientsOut struct {
	Group   string      `json:"group"`
	Clients []clientRow `json:"clients"`
}

func clientsView(group string, cs []wire.ClientInfo) *clientsOut {
	out := &clientsOut{Group: group, Clients: []clientRow{}}
	for _, c := range cs {
		out.Clients = append(out.Clients, clientRow{ID: c.ID, Hostname: c.Hostname, PID: c.PID,
			Registered: time.UnixMilli(int64(c.RegisteredUnixMS)).UTC(), Info: kvMap(c.Info)})
	}
	return out
}

func (c *clientsOut) render(w io.Writer) {
	fmt.Fprintf(w, "group %s: %d registered clients\n", c.Group, len(c.Clients))
	fmt.Fprintln(w, "ID\tHOST\tPID\tREGISTERED\tINFO")
	for _, r := range c.Clients {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", r.ID, r.Hostname, r.PID, r.Registered.Format(time.RFC3339), configString(r.Info))
	}
}

type nodeStats struct {
	ID      string             `json:"id"`
	Address string             `json:"address"`
	Error   string             `json:"error,omitempty"`
	Stats   map[string]float64 `json:"stats,omitempty"`
}

type statsOut struct {
	Group       string             `json:"group"`
	Members     int                `json:"members"`
	Reachable   int                `json:"reachable"`
	TotalWeight uint64             `json:"total_weight"`
	Clients     int                `json:"clients"`
	Totals      map[string]float64 `json:"totals"`
	Nodes       []nodeStats        `json:"nodes"`
}

// statsView asks every member for its STATS (concurrently, each bounded by timeout) and
// sums the counters.
func statsView(group string, t *wire.Topology, clients int, timeout time.Duration) *statsOut {
	out := &statsOut{Group: group, Clients: clients, Totals: map[string]float64{}, Nodes: []nodeStats{}}
	if t == nil {
		return out
	}
	out.Members = len(t.Members)
	out.Nodes = make([]nodeStats, len(t.Members))
	var wg sync.WaitGroup
	for i, m := range t.Members {
		out.TotalWeight += uint64(m.Weight)
		out.Nodes[i] = nodeStats{ID: m.ID, Address: m.Addr}
		wg.Add(1)
		go func(ns *nodeStats) {
			defer wg.Done()
			st, err := oneNodeStats(ns.Address, timeout)
			if err != nil {
				ns.Error = err.Error()
				return
			}
			ns.Stats = st
		}(&out.Nodes[i])
	}
	wg.Wait()
	for _, n := range out.Nodes {
		if n.Stats == nil {
			continue
		}
		out.Reachable++
		for k, v := range n.Stats {
			out.Totals[k] += v
		}
	}
	return out
}

func oneNodeStats(addr string, timeout time.Duration) (map[string]float64, error) {
	ms, err := client.NewStatic([]client.Member{{ID: addr, Addr: addr, Weight: 1}})
	if err != nil {
		return nil, err
	}
	c, err := client.New(client.Options{Membership: ms, IOTimeout: timeout, ConnectTimeout: timeout, Cooldown: time.Millisecond,
		Logger: quietLogger(), TLS: sec.cfg, Token: sec.token})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.NodeStats(context.Background(), addr) // bounded by the client's I/O timeout
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (s *statsOut) renderTotals(w io.Writer) {
	fmt.Fprintf(w, "group %s: %d members (%d reachable), total weight %d, %d registered clients\n",
		s.Group, s.Members, s.Reachable, s.TotalWeight, s.Clients)
	for _, k := range sortedKeys(s.Totals) {
		fmt.Fprintf(w, "%s\t%.0f\n", k, s.Totals[k])
	}
}

func (s *statsOut) renderAll(w io.Writer) {
	fmt.Fprintf(w, "group %s: %d members (%d reachable), %d registered clients\n", s.Group, s.Members, s.Reachable, s.Clients)
	keys := sortedKeys(s.Totals)
	fmt.Fprint(w, "ID\tADDRESS")
	for _, k := range keys {
		fmt.Fprintf(w, "\t%s", strings.TrimPrefix(k, "store_"))
	}
	fmt.Fprintln(w)
	for _, n := range s.Nodes {
		fmt.Fprintf(w, "%s\t%s", n.ID, n.Address)
		if n.Error != "" {
			fmt.Fprintf(w, "\tunreachable: %s\n", n.Error)
			continue
		}
		for _, k := range keys {
			fmt.Fprintf(w, "\t%.0f", n.Stats[k])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, "TOTAL\t")
	for _, k := range keys {
		fmt.Fprintf(w, "\t%.0f", s.Totals[k])
	}
	fmt.Fprintln(w)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
