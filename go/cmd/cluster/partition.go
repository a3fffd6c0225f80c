//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/testutil/netpart"
)

// partition cuts links with nftables drop rules in a network namespace of its own (it
// re-runs itself under `unshare --net`, so the rules touch nothing outside): one node cut
// off from the clients, the MDS replicas cut off from etcd, the etcd leader isolated (each
// etcd member runs as its own uid, so an output rule on the socket owner cuts what it
// sends). Library clients read under load throughout, rewriting what they miss; every
// phase reports its hit ratio, wrong bytes and slowest read. Go's e2e TestPartitions is the
// same at CI size.

const (
	partitionEnv   = "DFKV_CLUSTER_IN_NETNS"
	partitionTable = "dfkv_cluster_part"
	partitionUID   = 64200
	// A read of a cut-off node ends within the client's I/O deadline (5 s) or its connect
	// timeout (1 s); the slack is for a loaded machine.
	partitionOpBound = 5*time.Second + 3*time.Second
)

type partitionOptions struct {
	options
	keys, valueSize, workers int
	hold                     time.Duration
}

type phaseStats struct {
	name                      string
	hits, misses, errs, wrong atomic.Int64
	slowest                   atomic.Int64 // ns
	began                     time.Time
	took                      time.Duration
}

func partitionMain(args []string, stdout, stderr io.Writer) int {
	o := partitionOptions{}
	fs := o.modeFlags("partition", stderr, 10*time.Minute)
	fs.IntVar(&o.full, "clients", 4, "library clients (each its own MDS membership and connections)")
	fs.IntVar(&o.keys, "keys", 5000, "keys of the load")
	fs.IntVar(&o.valueSize, "value", 1024, "value bytes")
	fs.IntVar(&o.workers, "workers", 2, "reading goroutines per client")
	fs.DurationVar(&o.hold, "hold", 10*time.Second, "how long each partition lasts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.nodes < 2 || o.full < 1 || o.keys < 1 || o.valueSize < 16 || o.workers < 1 || o.hold <= 0 {
		fmt.Fprintln(stderr, "dfkv_cluster partition: want --nodes >= 2, --clients >= 1, --keys >= 1, --value >= 16, --workers >= 1, --hold > 0")
		return 2
	}
	if os.Getenv(partitionEnv) == "" {
		o.maxTime += time.Minute // the child ends by its own --max-time; the minute is for its clean-up
		return runBounded(o.options, stderr, func(ctx context.Context, _ *slog.Logger) error { return partitionReexec(ctx, args, stdout, stderr) })
	}
	return runBounded(o.options, stderr, func(ctx context.Context, log *slog.Logger) error { return partition(ctx, o, log, stdout) })
}

// errChildFailed: the run in the namespace failed and has said why on stderr.
var errChildFailed = errors.New("partition run failed")

// partitionReexec runs this command again in a new network namespace, bounded by ctx (a
// SIGTERM here reaches the child as SIGTERM: its deferred stops end the cluster).
func partitionReexec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := netpart.Check(ctx); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := netpart.Command(ctx, append(os.Environ(), partitionEnv+"=1"), self, append([]string{"partition"}, args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("%w (exit %d)", errChildFailed, ee.ExitCode())
		}
		return err
	}
	return nil
}

func partition(ctx context.Context, o partitionOptions, log *slog.Logger, w io.Writer) error {
	tbl, err := netpart.Setup(ctx, partitionTable)
	if err != nil {
		return err
	}
	c, ids, stop, err := bringUp(ctx, o.options, partitionUID, log)
	if err != nil {
		return err
	}
	defer stop()
	var mems []*client.MDSMembership
	var cls []*client.Client
	defer func() {
		for i := range cls {
			cls[i].Close()
			mems[i].Close()
		}
	}()
	for i := 0; i < o.full; i++ {
		eps := append([]string(nil), c.mdsEP...)
		if i%2 == 1 {
			eps[0], eps[len(eps)-1] = eps[len(eps)-1], eps[0]
		}
		m, cl, err := libClient(eps, o.group, "partition")
		if err != nil {
			return err
		}
		mems, cls = append(mems, m), append(cls, cl)
	}
	ringOf := func(n int) func() bool {
		return func() bool {
			for _, m := range mems {
				if len(m.View().Members) != n {
					return false
				}
			}
			return true
		}
	}
	if err := waitUntil(ctx, 60*time.Second, 10*time.Millisecond, "every client routes by every node", ringOf(o.nodes)); err != nil {
		return err
	}
	key := func(k int) []byte { return []byte(fmt.Sprintf("p-%d", k)) }
	val := make([]byte, o.valueSize)
	for k := 0; k < o.keys; k++ {
		rollValue(val, k)
		if err := cls[0].Put(ctx, key(k), val); err != nil {
			return fmt.Errorf("seeding key %d: %w", k, err)
		}
	}

	var cur atomic.Pointer[phaseStats]
	var phases []*phaseStats
	begin := func(name string) *phaseStats {
		if p := cur.Load(); p != nil {
			p.took = time.Since(p.began)
		}
		p := &phaseStats{name: name, began: time.Now()}
		phases = append(phases, p)
		cur.Store(p)
		log.Info("phase", "name", name)
		return p
	}
	begin("before")
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for ci, cl := range cls {
		for wk := 0; wk < o.workers; wk++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(ci), uint64(wk)))
				buf, want := make([]byte, o.valueSize), make([]byte, o.valueSize)
				for lctx.Err() == nil {
					k := r.IntN(o.keys)
					rollValue(want, k)
					t0 := time.Now()
					n, err := cl.GetAuto(lctx, key(k), buf)
					took := time.Since(t0)
					p := cur.Load()
					for s := p.slowest.Load(); int64(took) > s && !p.slowest.CompareAndSwap(s, int64(took)); s = p.slowest.Load() {
					}
					switch {
					case err == nil && bytes.Equal(buf[:n], want):
						p.hits.Add(1)
					case err == nil:
						p.wrong.Add(1)
					case errors.Is(err, client.ErrNotFound):
						p.misses.Add(1)
						_ = cl.Put(lctx, key(k), want)
					default:
						p.errs.Add(1)
						time.Sleep(time.Millisecond) // a cooled-down node answers at once
					}
				}
			}()
		}
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	var notes []string
	note := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		notes = append(notes, s)
		log.Info(s)
	}
	if err := sleep(5 * time.Second); err != nil {
		return err
	}

	// 1. One node cut off from the clients (its MDS heartbeats go on: it stays in the ring).
	victim := c.node(ids[len(ids)/2])
	_, port, _ := strings.Cut(victim.addr, ":")
	begin("node " + victim.id + " cut off from the clients")
	if err := tbl.Drop(ctx, netpart.PortDrops(port), nil); err != nil {
		return err
	}
	if err := sleep(o.hold); err != nil {
		return err
	}
	if !ringOf(o.nodes)() {
		note("a client dropped %s from its ring while it kept its MDS lease", victim.id)
	}
	if err := tbl.Heal(ctx); err != nil {
		return err
	}
	begin("after the node's heal")
	healed := time.Now()
	var theirs []int
	for k := 0; k < o.keys && len(theirs) < 50; k++ {
		if m, _ := mems[0].View().Owner(cls[0].ID(key(k)).Hi); m.ID == victim.id {
			theirs = append(theirs, k)
		}
	}
	buf := make([]byte, o.valueSize)
	if err := waitUntil(ctx, 30*time.Second, 50*time.Millisecond, victim.id+"'s keys served again", func() bool {
		for _, k := range theirs {
			if _, err := cls[len(cls)-1].GetAuto(ctx, key(k), buf); err != nil && !errors.Is(err, client.ErrNotFound) {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	note("%s served again %v after the heal", victim.id, time.Since(healed).Round(time.Millisecond))
	if err := sleep(5 * time.Second); err != nil {
		return err
	}

	// 2. Both MDS replicas cut off from etcd.
	epochs := make([]uint64, len(mems))
	for i, m := range mems {
		epochs[i] = m.View().Epoch
	}
	var in []string
	for _, ep := range c.eps {
		_, p, _ := strings.Cut(ep, ":")
		in = append(in, netpart.PortDrops(p)...)
	}
	begin("MDS cut off from etcd")
	cut := time.Now()
	if err := tbl.Drop(ctx, in, nil); err != nil {
		return err
	}
	for _, mx := range c.mdsMx {
		if err := waitUntil(ctx, 30*time.Second, 20*time.Millisecond, "MDS "+mx+" /readyz 503", func() bool { return httpStatus("http://"+mx+"/readyz") == 503 }); err != nil {
			return err
		}
	}
	note("both MDS /readyz 503 %v after the cut", time.Since(cut).Round(time.Millisecond))
	if err := sleep(max(o.hold-time.Since(cut), 0)); err != nil {
		return err
	}
	for i, m := range mems {
		if m.View().Epoch != epochs[i] {
			note("client %d changed its ring while the MDS was cut off from etcd (%d members)", i, len(m.View().Members))
		}
	}
	if err := tbl.Heal(ctx); err != nil {
		return err
	}
	begin("after the etcd heal")
	healed = time.Now()
	for _, mx := range c.mdsMx {
		if err := waitUntil(ctx, 30*time.Second, 20*time.Millisecond, "MDS "+mx+" /readyz 200", func() bool { return httpStatus("http://"+mx+"/readyz") == 200 }); err != nil {
			return err
		}
	}
	if err := waitUntil(ctx, 60*time.Second, 20*time.Millisecond, "every node in every client's ring", ringOf(o.nodes)); err != nil {
		return err
	}
	note("MDS ready and every ring whole %v after the heal", time.Since(healed).Round(time.Millisecond))
	if err := sleep(5 * time.Second); err != nil {
		return err
	}

	// 3. The etcd leader isolated; a node joins meanwhile.
	leader := -1
	if err := waitUntil(ctx, 30*time.Second, 100*time.Millisecond, "an etcd leader", func() bool {
		for i, ep := range c.eps {
			if id, l, err := netpart.EtcdStatus(ctx, ep); err == nil && l != "" && id == l {
				leader = i
				return true
			}
		}
		return false
	}); err != nil {
		return err
	}
	_, cp, _ := strings.Cut(c.eps[leader], ":")
	peer := peerPort(c.etcd[leader].args)
	begin(fmt.Sprintf("etcd leader e%d isolated", leader))
	cut = time.Now()
	if err := tbl.Drop(ctx, []string{"tcp dport { " + cp + ", " + peer + " } drop"}, []string{"meta skuid " + strconv.Itoa(partitionUID+leader) + " drop"}); err != nil {
		return err
	}
	if err := sleep(2 * time.Second); err != nil {
		return err
	}
	for _, mx := range c.mdsMx {
		if err := waitUntil(ctx, 30*time.Second, 20*time.Millisecond, "MDS "+mx+" ready with the leader isolated", func() bool { return httpStatus("http://"+mx+"/readyz") == 200 }); err != nil {
			return err
		}
	}
	if _, err := c.startNode(ctx, "j000"); err != nil {
		return err
	}
	joined := time.Now()
	if err := waitUntil(ctx, 30*time.Second, 5*time.Millisecond, "j000 in every client's ring", ringOf(o.nodes+1)); err != nil {
		return err
	}
	note("etcd leader isolated: j000's join reached every client %v after it was ready", time.Since(joined).Round(time.Millisecond))
	if err := sleep(max(o.hold-time.Since(cut), 0)); err != nil {
		return err
	}
	if err := tbl.Heal(ctx); err != nil {
		return err
	}
	begin("after the leader's heal")
	healed = time.Now()
	if err := waitUntil(ctx, 60*time.Second, 50*time.Millisecond, "the isolated member healthy", func() bool { return httpStatus("http://"+c.eps[leader]+"/health") == 200 }); err != nil {
		return err
	}
	note("etcd e%d healthy %v after the heal", leader, time.Since(healed).Round(time.Millisecond))
	if err := c.node("j000").proc.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		return err
	}
	drained := time.Now()
	if err := waitUntil(ctx, 30*time.Second, 5*time.Millisecond, "j000 drained from every client's ring", ringOf(o.nodes)); err != nil {
		return err
	}
	note("j000's drain reached every client %v after SIGTERM", time.Since(drained).Round(time.Millisecond))
	if err := sleep(5 * time.Second); err != nil {
		return err
	}
	cur.Load().took = time.Since(cur.Load().began)
	stopLoad()
	wg.Wait()

	fmt.Fprintf(w, "partitions: %d nodes, %d library clients x %d readers, %d keys of %d B, each partition held %v (3 etcd members, 2 MDS, defaults)\n",
		o.nodes, o.full, o.workers, o.keys, o.valueSize, o.hold)
	fmt.Fprintf(w, "%-36s %8s %9s %8s %7s %6s %9s\n", "phase", "took", "hit ratio", "misses", "errors", "wrong", "slowest")
	var wrong int64
	var slowest time.Duration
	for _, p := range phases {
		h, m, e := p.hits.Load(), p.misses.Load(), p.errs.Load()
		ratio := 0.0
		if h+m+e > 0 {
			ratio = float64(h) / float64(h+m+e)
		}
		wrong += p.wrong.Load()
		slowest = max(slowest, time.Duration(p.slowest.Load()))
		fmt.Fprintf(w, "%-36s %8v %9.4f %8d %7d %6d %9v\n", p.name, p.took.Round(100*time.Millisecond), ratio, m, e, p.wrong.Load(),
			time.Duration(p.slowest.Load()).Round(time.Millisecond))
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if wrong != 0 || slowest > partitionOpBound {
		return fmt.Errorf("partitions: %d wrong reads, slowest read %v (bound %v)", wrong, slowest, partitionOpBound)
	}
	return nil
}

// peerPort is the port of an etcd member's --listen-peer-urls.
func peerPort(args []string) string {
	for i, a := range args {
		if a == "--listen-peer-urls" && i+1 < len(args) {
			u := args[i+1]
			return u[strings.LastIndexByte(u, ':')+1:]
		}
	}
	return "0"
}
