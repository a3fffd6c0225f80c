//go:build linux

package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// replay: N nodes, M library clients (one per simulated engine process) replaying a
// conversation trace the way an engine does (leased batch exist of the request's blocks,
// batch get of the hit prefix, batch put of the rest), with or without --hot (the nodes'
// --hot-spread, docs/ARCHITECTURE.md "Hot objects"). It reports each node's read load
// (value bytes sent), busiest ÷ mean, the hit ratio, errors and wrong bytes.
//
//	dfkv_cluster replay --nodes 8 --limit 3000 --trace ../shared/data/traces/conversation_trace.jsonl [--hot]

type replayOptions struct {
	options
	trace        string
	limit, block int
	hot          bool
	hotInterval  time.Duration
	hotMinReads  int
}

type replayReport struct {
	Nodes         int       `json:"nodes"`
	Hot           bool      `json:"hot"`
	Requests      int       `json:"requests"`
	BlockRefs     int64     `json:"block_refs"`
	Hits          int64     `json:"hits"`
	HitRatio      float64   `json:"hit_ratio"`
	Errors        int64     `json:"errors"`
	WrongBytes    int64     `json:"wrong_bytes"`
	NodeSent      []float64 `json:"node_sent_bytes"`
	BusiestOver   float64   `json:"busiest_over_mean"`
	ReplicasMade  float64   `json:"replicas_made"`
	ReplicaReads  float64   `json:"replica_reads"`
	ReplicaMisses float64   `json:"replica_misses"`
	Invalidations float64   `json:"replicas_invalidated"`
	Seconds       float64   `json:"seconds"`
}

func replayMain(args []string, stdout, stderr io.Writer) int {
	o := replayOptions{}
	fs := o.modeFlags("replay", stderr, 10*time.Minute)
	fs.StringVar(&o.trace, "trace", "", "JSONL trace (hash_ids per request; .gz read as gzip), e.g. testdata/traces/conversation_trace.jsonl.gz")
	fs.IntVar(&o.clients, "clients", 8, "library clients (engine processes), each replaying every M-th request")
	fs.IntVar(&o.limit, "limit", 3000, "requests replayed (the trace's first)")
	fs.IntVar(&o.block, "block", 4096, "bytes per block")
	fs.BoolVar(&o.hot, "hot", false, "run the nodes with --hot-spread")
	fs.DurationVar(&o.hotInterval, "hot-interval", time.Second, "the nodes' --hot-interval with --hot")
	fs.IntVar(&o.hotMinReads, "hot-min-reads", 16, "the nodes' --hot-min-reads with --hot (low: one loaded machine replays ~100 requests/s)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the report as one JSON object")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.nodes < 1 || o.clients < 1 || o.limit < 1 || o.block < 16 || o.trace == "" {
		fmt.Fprintln(stderr, "dfkv_cluster replay: want --trace, --nodes >= 1, --clients >= 1, --limit >= 1, --block >= 16")
		return 2
	}
	var rep *replayReport
	if rc := runBounded(o.options, stderr, func(ctx context.Context, log *slog.Logger) (err error) {
		rep, err = replay(ctx, o, log)
		return err
	}); rc != 0 {
		return rc
	}
	if o.jsonOut {
		_ = json.NewEncoder(stdout).Encode(rep)
	} else {
		fmt.Fprintf(stdout, "replay: %d nodes, hot spreading %v, %d requests, %d block refs in %.1fs\n", rep.Nodes, rep.Hot, rep.Requests, rep.BlockRefs, rep.Seconds)
		fmt.Fprintf(stdout, "hit ratio %.4f (%d hits), errors %d, wrong bytes %d\n", rep.HitRatio, rep.Hits, rep.Errors, rep.WrongBytes)
		fmt.Fprintf(stdout, "read load (value bytes sent): busiest / mean %.3f; per node %v\n", rep.BusiestOver, rep.NodeSent)
		fmt.Fprintf(stdout, "replicas made %.0f, replica reads %.0f (misses %.0f: read again from the primary), invalidated %.0f\n", rep.ReplicasMade, rep.ReplicaReads, rep.ReplicaMisses, rep.Invalidations)
	}
	if rep.Errors != 0 || rep.WrongBytes != 0 {
		return 1
	}
	return 0
}

// loadReplayTrace reads the first limit requests' block ids.
func loadReplayTrace(path string, limit int) ([][]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") { // testdata/traces keeps the trace compressed
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var out [][]uint64
	for sc.Scan() && len(out) < limit {
		var r struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, len(out)+1, err)
		}
		out = append(out, r.HashIDs)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return out, nil
}

// replayFill is block id's content: a reader can tell any byte that is not it.
func replayFill(dst []byte, id uint64) {
	x := id*0x9e3779b97f4a7c15 + 1
	for i := 0; i+8 <= len(dst); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(dst[i:], x)
	}
}

func replay(ctx context.Context, o replayOptions, log *slog.Logger) (*replayReport, error) {
	reqs, err := loadReplayTrace(o.trace, o.limit)
	if err != nil {
		return nil, err
	}
	if o.hot {
		o.nodeArgs = []string{"--hot-spread", "--hot-interval", o.hotInterval.String(), "--hot-min-reads", strconv.Itoa(o.hotMinReads),
			"--hot-max-replicas", strconv.Itoa(min(wire.MaxHotReplicas, max(1, o.nodes-1)))}
	}
	c, _, stop, err := bringUp(ctx, o.options, 0, log)
	if err != nil {
		return nil, err
	}
	defer stop()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	clients := make([]*client.Client, o.clients)
	for i := range clients {
		mem, err := client.NewMDSMembership(client.MDSOptions{Endpoints: c.mdsEP, Group: o.group, Logger: quiet})
		if err != nil {
			return nil, err
		}
		cl, err := client.New(client.Options{Membership: mem, Namespace: []byte("replay"), Logger: quiet, IOTimeout: 30 * time.Second})
		if err != nil {
			mem.Close()
			return nil, err
		}
		defer cl.Close()
		clients[i] = cl
		if err := waitUntil(ctx, 60*time.Second, 10*time.Millisecond, "a client routes by every node", func() bool { return len(cl.View().Members) == o.nodes }); err != nil {
			return nil, err
		}
	}
	sent := func() ([]float64, map[string]float64) {
		loads := c.nodeLoad()
		out := make([]float64, len(loads))
		tot := map[string]float64{}
		for i, l := range loads {
			out[i] = l.SentBytes
			n := c.node(l.ID)
			m, _ := scrape("http://"+n.metricsAddr+"/metrics", "dfkv_server_hot_replicas_made_total", "dfkv_server_hot_replicas_invalidated_total", "dfkv_server_hot_replica_reads_total")
			for k, v := range m {
				tot[k] += v
			}
			tot["miss"] += scrapeLabeled("http://"+n.metricsAddr+"/metrics", "dfkv_server_hot_replica_reads_total", `result="miss"`)
		}
		return out, tot
	}
	before, _ := sent()
	var refs, hits, errs, wrong atomic.Int64
	var firstErr atomic.Value
	noteErr := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	start := time.Now()
	var wg sync.WaitGroup
	for ci, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := make([]byte, o.block)
			for ri := ci; ri < len(reqs) && ctx.Err() == nil; ri += len(clients) {
				blocks := reqs[ri]
				items := make([]client.Item, len(blocks))
				for i, id := range blocks {
					items[i].Key = []byte("b-" + strconv.FormatUint(id, 10))
				}
				refs.Add(int64(len(blocks)))
				if err := cl.BatchExistLease(ctx, items, 0); err != nil {
					noteErr(err)
					continue
				}
				prefix := 0
				for prefix < len(items) && items[prefix].Err == nil {
					prefix++
				}
				for i := prefix; i < len(items); i++ {
					if items[i].Err != nil && !errors.Is(items[i].Err, client.ErrNotFound) {
						noteErr(fmt.Errorf("exist: %w", items[i].Err))
					}
				}
				got := 0
				if prefix > 0 {
					gets := make([]client.Item, prefix)
					for i := range gets {
						gets[i] = client.Item{Key: items[i].Key, Buf: make([]byte, o.block)}
					}
					if err := cl.BatchGet(ctx, gets, client.Exact); err != nil {
						noteErr(err)
						continue
					}
					for i := range gets {
						if gets[i].Err != nil {
							if !errors.Is(gets[i].Err, client.ErrNotFound) {
								noteErr(fmt.Errorf("get: %w", gets[i].Err))
							}
							break // the engine uses the hit prefix only
						}
						replayFill(want, blocks[i])
						if string(gets[i].Buf) != string(want) {
							wrong.Add(1)
							break
						}
						got++
					}
				}
				hits.Add(int64(got))
				if got < len(items) {
					puts := make([]client.Item, 0, len(items)-got)
					for i := got; i < len(items); i++ {
						v := make([]byte, o.block)
						replayFill(v, blocks[i])
						puts = append(puts, client.Item{Key: items[i].Key, Value: v})
					}
					if err := cl.BatchPut(ctx, puts); err != nil {
						noteErr(err)
						continue
					}
					for i := range puts {
						if puts[i].Err != nil && !errors.Is(puts[i].Err, client.ErrCacheFull) {
							noteErr(fmt.Errorf("put: %w", puts[i].Err))
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("replay did not finish within --max-time: %w", err)
	}
	after, tot := sent()
	rep := &replayReport{Nodes: o.nodes, Hot: o.hot, Requests: len(reqs), BlockRefs: refs.Load(), Hits: hits.Load(),
		Errors: errs.Load(), WrongBytes: wrong.Load(), Seconds: elapsed.Seconds(),
		ReplicasMade: tot["dfkv_server_hot_replicas_made_total"], ReplicaReads: tot["dfkv_server_hot_replica_reads_total"], ReplicaMisses: tot["miss"], Invalidations: tot["dfkv_server_hot_replicas_invalidated_total"]}
	if rep.BlockRefs > 0 {
		rep.HitRatio = float64(rep.Hits) / float64(rep.BlockRefs)
	}
	var sum, top float64
	for i := range after {
		d := after[i]
		if i < len(before) {
			d -= before[i]
		}
		rep.NodeSent = append(rep.NodeSent, d)
		sum += d
		top = max(top, d)
	}
	if sum > 0 {
		rep.BusiestOver = top / (sum / float64(len(after)))
	}
	sort.Float64s(rep.NodeSent)
	if e := firstErr.Load(); e != nil {
		log.Warn("replay errors", "count", rep.Errors, "first", e)
	}
	return rep, nil
}

// scrapeLabeled sums the samples of family name whose labels contain label (0 if none).
func scrapeLabeled(url, name, label string) float64 {
	resp, err := httpc.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := sampleRE.FindStringSubmatch(sc.Text()); m != nil && m[1] == name && strings.Contains(m[2], label) {
			v, _ := strconv.ParseFloat(m[3], 64)
			total += v
		}
	}
	return total
}
