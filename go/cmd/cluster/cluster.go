//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// clusterConfig is what the harness starts. Everything binds to 127.0.0.1.
type clusterConfig struct {
	binDir, etcdBin, dir string
	group                string
	nodeCap              string
	mdsReplicas          int
	// etcdUID, when set, runs etcd member i as uid etcdUID+i (the partition mode isolates one
	// member with an nftables rule on the socket owner, which no port rule can do).
	etcdUID int
	// nodeArgs are appended to every dfkv_server's flags (replay: --hot-spread ...).
	nodeArgs []string
	log      *slog.Logger
}

type node struct {
	id                string
	proc              *proc
	addr, metricsAddr string
}

// cluster is a running three-member etcd, the MDS replicas and the cache nodes.
type cluster struct {
	cfg   clusterConfig
	etcd  []*proc
	eps   []string // etcd client endpoints
	mds   []*proc
	mdsEP []string // MDS endpoints
	mdsMx []string // MDS metrics addresses

	mu    sync.Mutex
	nodes map[string]*node
	rpc   *mdsclient.Client // the harness's own view of the MDS
}

func startCluster(ctx context.Context, cfg clusterConfig) (*cluster, error) {
	c := &cluster{cfg: cfg, nodes: map[string]*node{}}
	if err := c.startEtcd(ctx); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.startMDS(ctx); err != nil {
		c.stop()
		return nil, err
	}
	rpc, err := mdsclient.New(c.mdsEP, mdsclient.Options{CallTimeout: 2 * time.Second})
	if err != nil {
		c.stop()
		return nil, err
	}
	c.rpc = rpc
	return c, nil
}

func (c *cluster) startEtcd(ctx context.Context) error {
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	var initial []string
	for i := 0; i < 3; i++ {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i, ports[2*i+1]))
		c.eps = append(c.eps, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
	}
	for i := 0; i < 3; i++ {
		cl, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]), fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		p := &proc{name: fmt.Sprintf("etcd-%d", i), bin: c.cfg.etcdBin, logPath: logPath(c.cfg.dir, fmt.Sprintf("etcd-%d", i)),
			args: []string{"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(c.cfg.dir, fmt.Sprintf("etcd-%d", i)),
				"--listen-client-urls", cl, "--advertise-client-urls", cl, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--log-level", "error"}}
		if c.cfg.etcdUID > 0 {
			uid := c.cfg.etcdUID + i
			dataDir := filepath.Join(c.cfg.dir, fmt.Sprintf("etcd-%d", i))
			if err := os.MkdirAll(dataDir, 0o700); err != nil {
				return err
			}
			if err := os.Chown(dataDir, uid, uid); err != nil {
				return err
			}
			p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
		}
		if err := p.start(); err != nil {
			return err
		}
		c.etcd = append(c.etcd, p)
	}
	for _, ep := range c.eps {
		if err := waitUntil(ctx, 60*time.Second, 50*time.Millisecond, "etcd "+ep+" healthy", func() bool {
			return httpStatus("http://"+ep+"/health") == 200
		}); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) startMDS(ctx context.Context) error {
	ports, err := freePorts(2 * c.cfg.mdsReplicas)
	if err != nil {
		return err
	}
	for i := 0; i < c.cfg.mdsReplicas; i++ {
		ep, mx := fmt.Sprintf("127.0.0.1:%d", ports[2*i]), fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])
		// The MDS runs with its defaults: only addresses and etcd are set.
		p := &proc{name: fmt.Sprintf("mds-%d", i), bin: filepath.Join(c.cfg.binDir, "dfkv_mds"), logPath: logPath(c.cfg.dir, fmt.Sprintf("mds-%d", i)),
			args: []string{"--host", "127.0.0.1", "--listen", ep, "--metrics-port", strconv.Itoa(ports[2*i+1]),
				"--etcd", strings.Join(c.eps, ","), "--log-level", "warn"}}
		if err := p.start(); err != nil {
			return err
		}
		c.mds = append(c.mds, p)
		c.mdsEP = append(c.mdsEP, ep)
		c.mdsMx = append(c.mdsMx, mx)
	}
	for _, mx := range c.mdsMx {
		if err := waitUntil(ctx, 60*time.Second, 50*time.Millisecond, "MDS "+mx+" ready", func() bool {
			return httpStatus("http://"+mx+"/readyz") == 200
		}); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts (or restarts, same id and data directory) one dfkv_server that
// registers with the MDS, and waits until its /readyz says it is registered. Nodes run
// with GOMAXPROCS=1 and a small slab cap so that a hundred fit on a small machine. A node
// that exits before it is ready (e.g. its reserved metrics port was taken meanwhile) is
// started again on fresh ports, twice at most.
func (c *cluster) startNode(ctx context.Context, id string) (*node, error) {
	var err error
	for try := 0; try < 3; try++ {
		var n *node
		if n, err = c.startNodeOnce(ctx, id, try > 0); err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			break
		}
		c.cfg.log.Warn("node start failed; retrying on new ports", "id", id, "err", err)
	}
	return nil, err
}

func (c *cluster) startNodeOnce(ctx context.Context, id string, fresh bool) (*node, error) {
	c.mu.Lock()
	n := c.nodes[id]
	c.mu.Unlock()
	if n == nil || fresh {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(c.cfg.dir, "node-"+id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		n = &node{id: id, metricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[0])}
		n.proc = &proc{name: id, bin: filepath.Join(c.cfg.binDir, "dfkv_server"), logPath: logPath(c.cfg.dir, "node-"+id),
			env: []string{"GOMAXPROCS=1"},
			args: []string{"--host", "127.0.0.1", "--port", "0", "--addr-file", filepath.Join(dir, "addr"), "--dir", filepath.Join(dir, "data"),
				"--store-engine", "slab", "--cap", c.cfg.nodeCap, "--max-msg", "1MiB", "--metrics-port", strconv.Itoa(ports[0]),
				"--mds", strings.Join(c.mdsEP, ","), "--group", c.cfg.group, "--id", id, "--advertise", "127.0.0.1:0", "--log-level", "warn"}}
		n.proc.args = append(n.proc.args, c.cfg.nodeArgs...)
		c.mu.Lock()
		c.nodes[id] = n
		c.mu.Unlock()
	}
	if err := n.proc.start(); err != nil {
		return nil, err
	}
	exited := false
	if err := waitUntil(ctx, 180*time.Second, 20*time.Millisecond, id+" registered", func() bool {
		if !n.proc.running() {
			exited = true
			return true
		}
		if httpStatus("http://"+n.metricsAddr+"/readyz") != 200 {
			return false
		}
		// The address file can lag /readyz: a node without its address cannot be cut off.
		b, _ := os.ReadFile(filepath.Join(c.cfg.dir, "node-"+id, "addr"))
		n.addr = strings.TrimSpace(string(b))
		return strings.Contains(n.addr, ":")
	}); err != nil {
		return nil, err
	}
	if exited {
		b, _ := os.ReadFile(n.proc.logPath)
		if len(b) > 400 {
			b = b[len(b)-400:]
		}
		return nil, fmt.Errorf("%s exited before it was ready: %s", id, strings.TrimSpace(string(b)))
	}
	return n, nil
}

// startNodes starts ids with at most par starts in flight.
func (c *cluster) startNodes(ctx context.Context, ids []string, par int) error {
	sem := make(chan struct{}, par)
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := c.startNode(ctx, id); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (c *cluster) node(id string) *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// topology is a direct (non-waiting) read through the MDS.
func (c *cluster) topology(ctx context.Context) (*wire.MdsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, _, err := c.rpc.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: c.cfg.group})
	if err != nil {
		return nil, err
	}
	if resp.Topology == nil {
		return nil, fmt.Errorf("topology reply without a topology")
	}
	return resp, nil
}

func memberIDs(t *wire.Topology) map[string]bool {
	out := map[string]bool{}
	for _, m := range t.Members {
		out[m.ID] = true
	}
	return out
}

// mdsCPU is the summed CPU time of the MDS replicas.
func (c *cluster) mdsCPU() time.Duration {
	var d time.Duration
	for _, p := range c.mds {
		d += p.cpu()
	}
	return d
}

// nodeLoad scrapes every running node's request and byte counters (per-node load).
func (c *cluster) nodeLoad() []nodeLoad {
	c.mu.Lock()
	ns := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		ns = append(ns, n)
	}
	c.mu.Unlock()
	sort.Slice(ns, func(i, j int) bool { return ns[i].id < ns[j].id })
	var out []nodeLoad
	for _, n := range ns {
		if !n.proc.running() {
			continue
		}
		m, err := scrape("http://"+n.metricsAddr+"/metrics", "dfkv_server_requests_total", "dfkv_server_sent_bytes_total", "dfkv_server_received_bytes_total")
		if err != nil {
			continue
		}
		out = append(out, nodeLoad{ID: n.id, Requests: m["dfkv_server_requests_total"], SentBytes: m["dfkv_server_sent_bytes_total"], ReceivedBytes: m["dfkv_server_received_bytes_total"]})
	}
	return out
}

type nodeLoad struct {
	ID                                 string
	Requests, SentBytes, ReceivedBytes float64
}

// stop ends every process: nodes with SIGTERM (they deregister), then MDS and etcd.
func (c *cluster) stop() {
	if c.rpc != nil {
		c.rpc.Close()
	}
	c.mu.Lock()
	ns := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		ns = append(ns, n)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range ns {
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.proc.signal(syscall.SIGTERM, 15*time.Second) }()
	}
	wg.Wait()
	for _, p := range c.mds {
		_ = p.signal(syscall.SIGTERM, 10*time.Second)
	}
	for _, p := range c.etcd {
		_ = p.signal(syscall.SIGTERM, 10*time.Second)
	}
}

// modeFlags is a mode's flag set with the flags every mode shares registered; maxTime is
// the mode's default bound.
func (o *options) modeFlags(mode string, stderr io.Writer, maxTime time.Duration) *flag.FlagSet {
	fs := flag.NewFlagSet("dfkv_cluster "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.binDir, "bin", "build", "directory with dfkv_server and dfkv_mds")
	fs.StringVar(&o.etcdBin, "etcd", "etcd", "etcd binary (Debian: etcd-server)")
	fs.StringVar(&o.dir, "dir", "", "work directory (default: a new temp dir, removed afterwards unless --keep)")
	fs.StringVar(&o.group, "group", "cluster", "MDS group")
	fs.StringVar(&o.nodeCap, "node-cap", "64MiB", "each node's --cap")
	fs.IntVar(&o.nodes, "nodes", 8, "cache nodes (at start)")
	fs.IntVar(&o.par, "start-par", 8, "node starts in flight at once")
	fs.DurationVar(&o.maxTime, "max-time", maxTime, "the whole run ends by then")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs)")
	return fs
}

// runBounded runs a mode's body with a logger on stderr and a context that ends at
// --max-time or on SIGINT/SIGTERM, so that the body's deferred stops still end every child.
func runBounded(o options, stderr io.Writer, body func(context.Context, *slog.Logger) error) int {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithTimeout(context.Background(), o.maxTime)
	defer cancel()
	ctx, stopSig := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSig()
	if err := body(ctx, log); err != nil {
		fmt.Fprintln(stderr, "dfkv_cluster:", err)
		return 1
	}
	return 0
}

// bringUp starts what every mode runs on: a three-member etcd, two MDS replicas and
// o.nodes nodes n000, n001, ... in o.dir (a new temp dir unless --dir). stop ends them and
// removes the temp dir unless --keep. etcdUID is clusterConfig's.
func bringUp(ctx context.Context, o options, etcdUID int, log *slog.Logger) (c *cluster, ids []string, stop func(), err error) {
	var undo []func()
	stopAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stopAll()
		}
	}()
	if o.dir == "" {
		d, err := os.MkdirTemp("", "dfkv-cluster-")
		if err != nil {
			return nil, nil, nil, err
		}
		o.dir = d
		if !o.keep {
			undo = append(undo, func() { os.RemoveAll(d) })
		}
	}
	if etcdUID > 0 { // the etcd members' uids reach their dirs
		if err := os.Chmod(o.dir, 0o755); err != nil {
			return nil, nil, nil, err
		}
	}
	bin, err := filepath.Abs(o.binDir)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, b := range []string{"dfkv_server", "dfkv_mds"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, nil, nil, fmt.Errorf("%s not in --bin %s (tools/build.sh builds it): %w", b, bin, err)
		}
	}
	log.Info("starting etcd (3 members) and the MDS replicas", "dir", o.dir)
	c, err = startCluster(ctx, clusterConfig{binDir: bin, etcdBin: o.etcdBin, dir: o.dir, group: o.group, nodeCap: o.nodeCap,
		mdsReplicas: 2, etcdUID: etcdUID, nodeArgs: o.nodeArgs, log: log})
	if err != nil {
		return nil, nil, nil, err
	}
	undo = append(undo, c.stop)
	ids = make([]string, o.nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%03d", i)
	}
	t0 := time.Now()
	if err := c.startNodes(ctx, ids, o.par); err != nil {
		return nil, nil, nil, err
	}
	log.Info("nodes registered", "nodes", o.nodes, "took", time.Since(t0).Round(time.Millisecond))
	return c, ids, stopAll, nil
}
