//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/ring"
)

// traceOptions are the flags of `dfkv_bench trace`.
type traceOptions struct {
	trace          string
	members        string
	mds            string
	mdsGroup       string
	ns             string
	ringPoints     int
	blockBytes     cli.Size
	speed          float64
	asFast         bool
	limit          int
	capacityBlocks int64
	minRatio       float64
	ioTimeout      time.Duration
	maxTime        time.Duration
	progress       time.Duration
	jsonOut        bool
	label          string
	simulate       bool
}

// traceResult is the replay's outcome; the JSON form is one object with these fields.
type traceResult struct {
	Label          string  `json:"label,omitempty"`
	Nodes          int     `json:"nodes"`
	Requests       int     `json:"requests"`
	BlockRefs      int64   `json:"block_refs"`
	DistinctBlocks int64   `json:"distinct_blocks"`
	BlockBytes     int64   `json:"block_bytes"`
	PrefixHits     int64   `json:"prefix_hits"`
	HitRatio       float64 `json:"hit_ratio"`
	LRUHits        int64   `json:"lru_hits"`
	LRURatio       float64 `json:"lru_ratio"`
	// Belady: the offline optimum at the same capacity (evict the block needed last), the
	// ceiling of any online policy on this trace.
	BeladyHits  int64   `json:"belady_hits"`
	BeladyRatio float64 `json:"belady_ratio"`
	// NodeLRU: one exact LRU per node at that node's capacity, fed by the client's routing
	// (equal to LRU on one node). The gap between it and LRU is the ring's imbalance.
	NodeLRUHits  int64   `json:"node_lru_hits"`
	NodeLRURatio float64 `json:"node_lru_ratio"`
	VsNodeLRU    float64 `json:"vs_node_lru"`
	// NodeShares is each node's share of the distinct blocks under the client's routing
	// (View().Members order); absent with one node.
	NodeShares     []float64 `json:"node_key_shares,omitempty"`
	MaxRatio       float64   `json:"max_ratio"`
	CapacityBlocks int64     `json:"capacity_blocks"`
	CapacityBytes  int64     `json:"capacity_bytes"`
	// LiveBytes is the value bytes the cluster holds at the end (objects × block bytes);
	// Efficiency = LiveBytes / CapacityBytes (0 when the nodes do not report stats).
	LiveBytes  int64   `json:"live_bytes"`
	Efficiency float64 `json:"capacity_efficiency"`
	VsLRU      float64 `json:"vs_lru"` // hit_ratio / lru_ratio
	// DiskReads counts the disk reads during the replay (store_read_bytes ÷ padded block);
	// RAMServed = 1 - DiskReads/PrefixHits is the share of hits a RAM tier served.
	DiskReads    int64   `json:"disk_reads"`
	RAMServed    float64 `json:"hits_served_from_ram"`
	LookupMisses int64   `json:"lookup_then_get_misses"`
	Puts         int64   `json:"puts"`
	Errors       int64   `json:"errors"`
	Corrupt      int64   `json:"corrupt"`
	Seconds      float64 `json:"seconds"`
}

func (r *traceResult) line() string {
	return fmt.Sprintf("trace: requests=%d block_refs=%d prefix_hits=%d hit_ratio=%.4f lru_ratio=%.4f belady_ratio=%.4f max_ratio=%.4f capacity_blocks=%d node_lru_ratio=%.4f efficiency=%.3f",
		r.Requests, r.BlockRefs, r.PrefixHits, r.HitRatio, r.LRURatio, r.BeladyRatio, r.MaxRatio, r.CapacityBlocks, r.NodeLRURatio, r.Efficiency)
}

func traceUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: dfkv_bench trace --trace FILE (--members id=host:port,... | --mds host:port,...)
                        --block-bytes N [--ns NS] [--speed X | --as-fast-as-possible] [--json]
Replays an inference trace (Mooncake JSON lines, optionally .gz) against a live cluster: per
request, in order, BatchExist on its blocks, BatchGet of the hit prefix (bytes verified), BatchPut
of the blocks after the prefix. Compares the prefix hits with an exact LRU of the cluster's
capacity in blocks, with Belady's offline optimum (evict the block needed last) and with an
infinite cache.
exit status: 0 ok, 1 errors, corrupt bytes or hit_ratio < --min-ratio × lru_ratio, 2 setup error
flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func parseTraceFlags(args []string, stderr io.Writer) (*traceOptions, int, bool) {
	o := &traceOptions{blockBytes: 64 << 10}
	fs := flag.NewFlagSet("dfkv_bench trace", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.trace, "trace", "", "trace file: JSON lines with hash_ids (plain or gzip)")
	fs.StringVar(&o.members, "members", "", "dfkv nodes: id=host:port[,id=host:port...]")
	fs.StringVar(&o.mds, "mds", "", "MDS endpoints host:port[,host:port...] (instead of --members)")
	fs.StringVar(&o.mdsGroup, "mds-group", "", "MDS group (default: the client's default)")
	fs.StringVar(&o.ns, "ns", "trace", "namespace of the replayed blocks")
	fs.IntVar(&o.ringPoints, "ring-points", 0, "placement ring points per unit of weight (0: the client default; 160: the first releases' ring)")
	fs.Var(&o.blockBytes, "block-bytes", "bytes of one KV block value (KiB/MiB suffixes)")
	fs.Float64Var(&o.speed, "speed", 0, "pace request starts at X times the trace's timestamps (0: as fast as possible)")
	fs.BoolVar(&o.asFast, "as-fast-as-possible", false, "ignore timestamps (the default)")
	fs.IntVar(&o.limit, "limit", 0, "replay only the first N requests (0: all)")
	fs.Int64Var(&o.capacityBlocks, "capacity-blocks", 0, "LRU capacity in blocks (0: the nodes' reported capacity ÷ block bytes)")
	fs.Float64Var(&o.minRatio, "min-ratio", 0, "fail (exit 1) when hit_ratio < X × lru_ratio (0: off)")
	fs.DurationVar(&o.ioTimeout, "io-timeout", 10*time.Second, "per-call I/O deadline")
	fs.DurationVar(&o.maxTime, "max-time", time.Hour, "hard limit on the replay; reaching it is a failure")
	fs.DurationVar(&o.progress, "progress", 5*time.Second, "progress line period on stderr (0: off)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the result as one JSON object after the trace: line")
	fs.StringVar(&o.label, "label", "", "free-form label copied into the result")
	fs.BoolVar(&o.simulate, "simulate", false, "no cluster: print the simulated policies at --capacity-blocks (per node over --members' ring when it names several)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			traceUsage(stderr, fs)
			return nil, exitOK, false
		}
		fmt.Fprintln(stderr, "dfkv_bench trace:", err)
		traceUsage(stderr, fs)
		return nil, exitSetup, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dfkv_bench trace: unexpected argument %q\n", fs.Arg(0))
		return nil, exitSetup, false
	}
	var errs []error
	switch {
	case o.trace == "":
		errs = append(errs, errors.New("--trace is required"))
	case o.simulate && (o.capacityBlocks <= 0 || o.mds != ""):
		errs = append(errs, errors.New("--simulate needs --capacity-blocks (and --members, not --mds, for a ring)"))
	case !o.simulate && (o.members == "") == (o.mds == ""):
		errs = append(errs, errors.New("give exactly one of --members and --mds"))
	case o.blockBytes < 8 || o.blockBytes > 1<<30:
		errs = append(errs, fmt.Errorf("--block-bytes %d out of range [8, 1GiB]", o.blockBytes))
	case o.speed < 0 || (o.asFast && o.speed > 0):
		errs = append(errs, errors.New("--speed must be positive and excludes --as-fast-as-possible"))
	case o.limit < 0 || o.capacityBlocks < 0 || o.minRatio < 0 || o.maxTime <= 0 || o.ioTimeout <= 0:
		errs = append(errs, errors.New("--limit, --capacity-blocks and --min-ratio must not be negative; --max-time and --io-timeout positive"))
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(stderr, "dfkv_bench trace:", err)
		return nil, exitSetup, false
	}
	return o, 0, true
}

// traceMain is `dfkv_bench trace`.
func traceMain(args []string, stdout, stderr io.Writer) int {
	o, code, ok := parseTraceFlags(args, stderr)
	if !ok {
		return code
	}
	reqs, err := loadTrace(o.trace)
	if err != nil {
		fmt.Fprintln(stderr, "dfkv_bench trace:", err)
		return exitSetup
	}
	if o.limit > 0 && o.limit < len(reqs) {
		reqs = reqs[:o.limit]
	}
	if o.simulate {
		if err := simulatePolicies(stdout, reqs, o); err != nil {
			fmt.Fprintln(stderr, "dfkv_bench trace:", err)
			return exitSetup
		}
		return exitOK
	}
	c, err := openTraceClient(o)
	if err != nil {
		fmt.Fprintln(stderr, "dfkv_bench trace:", err)
		return exitSetup
	}
	defer c.Close()
	res, err := replayTrace(context.Background(), c, reqs, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "dfkv_bench trace:", err)
		return exitSetup
	}
	fmt.Fprintln(stdout, res.line())
	if o.jsonOut {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	}
	switch {
	case res.Errors > 0 || res.Corrupt > 0:
		fmt.Fprintf(stderr, "dfkv_bench trace: %d errors, %d blocks with wrong bytes\n", res.Errors, res.Corrupt)
		return exitFail
	case o.minRatio > 0 && res.HitRatio < o.minRatio*res.LRURatio:
		fmt.Fprintf(stderr, "dfkv_bench trace: hit_ratio %.4f < %.3f × lru_ratio %.4f\n", res.HitRatio, o.minRatio, res.LRURatio)
		return exitFail
	}
	return exitOK
}

func openTraceClient(o *traceOptions) (*client.Client, error) {
	var ms client.Membership
	if o.members != "" {
		members, err := client.ParseMembers(o.members)
		if err != nil {
			return nil, err
		}
		if ms, err = client.NewStatic(members, ring.WithPointsPerWeight(o.ringPoints)); err != nil {
			return nil, err
		}
	} else {
		m, err := client.NewMDSMembership(client.MDSOptions{Endpoints: strings.Split(o.mds, ","), Group: o.mdsGroup,
			RingPointsPerWeight: o.ringPoints})
		if err != nil {
			return nil, err
		}
		ms = m
	}
	return client.New(client.Options{
		Membership: ms,
		Namespace:  []byte(o.ns),
		IOTimeout:  o.ioTimeout,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

// blockKey is the cache key of block id; blockFill derives the block's bytes from its id
// (splitmix64 words), so that any byte a GET returns can be checked without keeping a copy.
func blockKey(dst []byte, id uint64) []byte {
	return strconv.AppendUint(append(dst[:0], "blk-"...), id, 10)
}

func blockFill(dst []byte, id uint64) {
	x := id*0x9e3779b97f4a7c15 + 0x632be59bd9b4e5b
	var w [8]byte
	for i := 0; i < len(dst); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(w[:], z^z>>31)
		copy(dst[i:], w[:])
	}
}

// clusterSnap sums what the nodes report over STATS.
type clusterSnap struct {
	capacity, objects, readBytes int64
	nodes                        int
	nodeCapacity                 []int64 // index-aligned with View().Members
}

func clusterStats(ctx context.Context, c *client.Client) (clusterSnap, error) {
	var s clusterSnap
	for _, m := range c.View().Members {
		st, err := c.NodeStats(ctx, m.Addr)
		if err != nil {
			return clusterSnap{}, fmt.Errorf("stats of %s (%s): %w", m.ID, m.Addr, err)
		}
		s.capacity += int64(st["store_capacity_bytes"])
		s.nodeCapacity = append(s.nodeCapacity, int64(st["store_capacity_bytes"]))
		s.objects += int64(st["store_objects"])
		s.readBytes += int64(st["store_read_bytes"])
		s.nodes++
	}
	return s, nil
}

// replayTrace drives the cluster with reqs, one request at a time in trace order, and
// compares its prefix hits with the simulations at the cluster's capacity in blocks.
func replayTrace(ctx context.Context, c *client.Client, reqs []traceRequest, o *traceOptions, progress io.Writer) (*traceResult, error) {
	bb := int64(o.blockBytes)
	snap0, err := clusterStats(ctx, c)
	if err != nil && o.capacityBlocks == 0 {
		return nil, fmt.Errorf("%w (give --capacity-blocks when the nodes cannot report stats)", err)
	}
	capBytes, nodes := snap0.capacity, len(c.View().Members)
	if nodes == 0 {
		return nil, errors.New("the membership has no nodes")
	}
	facts := factsOf(reqs)
	res := &traceResult{Label: o.label, Nodes: nodes, Requests: facts.Requests, BlockRefs: facts.BlockRefs,
		DistinctBlocks: facts.Distinct, BlockBytes: bb, CapacityBytes: capBytes, CapacityBlocks: o.capacityBlocks}
	if res.CapacityBlocks == 0 {
		res.CapacityBlocks = capBytes / bb
	}
	maxLen := 0
	for _, q := range reqs {
		maxLen = max(maxLen, len(q.HashIDs))
	}
	// One request's buffers, reused for every request: keys, values and GET targets.
	keys := make([][]byte, maxLen)
	vals := make([][]byte, maxLen)
	want := make([]byte, bb)
	for i := range keys {
		keys[i] = make([]byte, 0, 24)
		vals[i] = make([]byte, bb)
	}
	items := make([]client.Item, maxLen)

	start := time.Now()
	deadline := start.Add(o.maxTime)
	lastProgress := start
	for qi, q := range reqs {
		now := time.Now()
		if now.After(deadline) {
			return nil, fmt.Errorf("--max-time %v reached after %d of %d requests", o.maxTime, qi, len(reqs))
		}
		if o.speed > 0 {
			at := start.Add(time.Duration(float64(q.Timestamp) / o.speed * float64(time.Millisecond)))
			if d := time.Until(at); d > 0 {
				time.Sleep(d) // pacing the next start: there is no event to wait for
			}
		}
		if o.progress > 0 && now.Sub(lastProgress) >= o.progress {
			lastProgress = now
			fmt.Fprintf(progress, "trace: %d/%d requests, prefix_hits=%d errors=%d (%.0fs)\n",
				qi, len(reqs), res.PrefixHits, res.Errors, now.Sub(start).Seconds())
		}
		n := len(q.HashIDs)
		if n == 0 {
			continue
		}
		for i, id := range q.HashIDs {
			keys[i] = blockKey(keys[i], id)
			items[i] = client.Item{Key: keys[i]}
		}
		// Lookup: the prefix of present blocks is what the engine would reuse.
		// TODO(issue 13): use the leased lookup once the server has it, so that the
		// prefix cannot be evicted between this lookup and the GET.
		if err := c.BatchExist(ctx, items[:n]); err != nil {
			res.Errors += int64(n)
			continue
		}
		prefix := 0
		for prefix < n && items[prefix].Err == nil {
			prefix++
		}
		for i := prefix; i < n; i++ {
			if err := items[i].Err; err != nil && !client.IsMiss(err) {
				res.Errors++
			}
		}
		// Reuse: GET the prefix and verify every byte; a block that vanished since the
		// lookup ends the prefix there (it is recomputed like any miss).
		hits := 0
		if prefix > 0 {
			for i := 0; i < prefix; i++ {
				items[i] = client.Item{Key: keys[i], Buf: vals[i]}
			}
			if err := c.BatchGet(ctx, items[:prefix], client.Exact); err != nil {
				res.Errors += int64(prefix)
			} else {
				for hits < prefix {
					it := &items[hits]
					if it.Err != nil {
						if client.IsMiss(it.Err) {
							res.LookupMisses++
						} else {
							res.Errors++
						}
						break
					}
					blockFill(want, q.HashIDs[hits])
					if it.N != bb || string(vals[hits]) != string(want) {
						res.Corrupt++
						break
					}
					hits++
				}
			}
		}
		res.PrefixHits += int64(hits)
		// Recompute: store every block after the reused prefix.
		if hits < n {
			for i := hits; i < n; i++ {
				blockFill(vals[i], q.HashIDs[i])
				items[i] = client.Item{Key: keys[i], Value: vals[i]}
			}
			if err := c.BatchPut(ctx, items[hits:n]); err != nil {
				res.Errors += int64(n - hits)
			} else {
				for i := hits; i < n; i++ {
					if items[i].Err != nil {
						res.Errors++
					}
				}
			}
			res.Puts += int64(n - hits)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if capBytes > 0 {
		if snap, err := clusterStats(ctx, c); err == nil {
			res.LiveBytes = snap.objects * bb
			res.Efficiency = float64(res.LiveBytes) / float64(capBytes)
			// Disk reads are the hits a RAM tier did not serve (one O_DIRECT read each).
			res.DiskReads = (snap.readBytes - snap0.readBytes) / ((bb + 4095) &^ 4095)
			if res.PrefixHits > 0 {
				res.RAMServed = max(0, 1-float64(res.DiskReads)/float64(res.PrefixHits))
			}
		}
	}
	res.LRUHits = lruHits(reqs, int(res.CapacityBlocks))
	res.BeladyHits = beladyHits(reqs, int(res.CapacityBlocks))
	if nodes > 1 {
		res.NodeLRUHits, res.NodeShares = nodeLRUHits(c, reqs, snap0.nodeCapacity, res.CapacityBlocks, bb)
	} else {
		res.NodeLRUHits = res.LRUHits
	}
	if facts.BlockRefs > 0 {
		res.HitRatio = float64(res.PrefixHits) / float64(facts.BlockRefs)
		res.LRURatio = float64(res.LRUHits) / float64(facts.BlockRefs)
		res.BeladyRatio = float64(res.BeladyHits) / float64(facts.BlockRefs)
		res.MaxRatio = float64(maxHits(reqs)) / float64(facts.BlockRefs)
	}
	if res.LRURatio > 0 {
		res.VsLRU = res.HitRatio / res.LRURatio
	}
	if facts.BlockRefs > 0 && res.NodeLRUHits > 0 {
		res.NodeLRURatio = float64(res.NodeLRUHits) / float64(facts.BlockRefs)
		res.VsNodeLRU = res.HitRatio / res.NodeLRURatio
	}
	return res, nil
}

// simulatePolicies prints, for the trace at o.capacityBlocks, the hits of each simulated
// policy and their ratio to an exact LRU: the infinite cache, LRU, Belady's offline optimum, the slab's CLOCK (new
// values unreferenced) and the CLOCK the slab had before (referenced on insert); with
// several --members, the same per node (equal shares) over the client's ring, plus each
// node's share of the blocks. No node is contacted.
func simulatePolicies(w io.Writer, reqs []traceRequest, o *traceOptions) error {
	facts := factsOf(reqs)
	capBlocks := int(o.capacityBlocks)
	lru := lruHits(reqs, capBlocks)
	line := func(policy string, hits int64) {
		vs := 0.0
		if lru > 0 {
			vs = float64(hits) / float64(lru)
		}
		fmt.Fprintf(w, "sim: policy=%s capacity_blocks=%d hits=%d ratio=%.4f vs_lru=%.3f\n",
			policy, capBlocks, hits, float64(hits)/float64(max(facts.BlockRefs, 1)), vs)
	}
	line("infinite", maxHits(reqs))
	line("lru", lru)
	line("belady", beladyHits(reqs, capBlocks))
	line("clock", simulate(reqs, newClock(capBlocks, slabMaxRef, false)))
	line("clock-bit", simulate(reqs, newClock(capBlocks, 1, false)))
	line("clock-ref-on-insert", simulate(reqs, newClock(capBlocks, 1, true)))
	if o.members == "" {
		return nil
	}
	c, err := openTraceClient(o) // routing only: nothing is dialled
	if err != nil {
		return err
	}
	defer c.Close()
	v := c.View()
	if len(v.Members) < 2 {
		return nil
	}
	owner, shares := routeBlocks(c, reqs)
	per := capBlocks / len(v.Members)
	for _, pol := range []struct {
		name string
		mk   func() blockCache
	}{
		{"node-lru", func() blockCache { return newLRU(per) }},
		{"node-clock", func() blockCache { return newClock(per, slabMaxRef, false) }},
		{"node-clock-bit", func() blockCache { return newClock(per, 1, false) }},
		{"node-clock-ref-on-insert", func() blockCache { return newClock(per, 1, true) }},
	} {
		p := &partitionedCache{owner: owner}
		for range v.Members {
			p.nodes = append(p.nodes, pol.mk())
		}
		line(pol.name, simulate(reqs, p))
	}
	fmt.Fprintf(w, "sim: node_key_shares=%.4f\n", shares)
	return nil
}

// routeBlocks maps every block of the trace to the index (in View().Members) of the node
// the client routes its key to, and returns each node's share of the distinct blocks.
func routeBlocks(c *client.Client, reqs []traceRequest) (map[uint64]int, []float64) {
	v := c.View()
	index := make(map[string]int, len(v.Members))
	for i, m := range v.Members {
		index[m.ID] = i
	}
	owner := make(map[uint64]int)
	var key []byte
	for _, q := range reqs {
		for _, h := range q.HashIDs {
			if _, ok := owner[h]; ok {
				continue
			}
			key = blockKey(key, h)
			m, _ := v.Owner(c.ID(key).Hi)
			owner[h] = index[m.ID]
		}
	}
	shares := make([]float64, len(v.Members))
	for _, i := range owner {
		shares[i] += 1 / float64(len(owner))
	}
	return owner, shares
}

// partitionedCache routes each block to one of several caches, as the client routes keys.
type partitionedCache struct {
	owner map[uint64]int
	nodes []blockCache
}

func (p *partitionedCache) hit(id uint64) bool { return p.nodes[p.owner[id]].hit(id) }
func (p *partitionedCache) store(id uint64)    { p.nodes[p.owner[id]].store(id) }

// nodeLRUHits simulates one exact LRU per node, each of that node's capacity in blocks
// (equal shares of capacityBlocks when the nodes did not report), fed the blocks the
// client's ring routes to it: the best a per-node eviction policy can match, whatever the
// ring's balance.
// It also returns each node's share of the distinct blocks.
func nodeLRUHits(c *client.Client, reqs []traceRequest, nodeCap []int64, capacityBlocks, bb int64) (int64, []float64) {
	v := c.View()
	owner, shares := routeBlocks(c, reqs)
	p := &partitionedCache{owner: owner}
	for i := range v.Members {
		blocks := capacityBlocks / int64(len(v.Members))
		if len(nodeCap) == len(v.Members) {
			blocks = nodeCap[i] / bb
		}
		p.nodes = append(p.nodes, newLRU(int(blocks)))
	}
	return simulate(reqs, p), shares
}
