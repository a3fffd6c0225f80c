package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// Hot objects (docs/ARCHITECTURE.md "Hot objects"): three real nodes with --hot-spread,
// several clients hammering one key until its primary replicates it, then overwrites and a
// remove while the replicas exist. Every read is checked against the last acknowledged
// write: bytes and CRC must be a version at least as new as the last write acknowledged
// before the read began, and a read begun after the remove was acknowledged must miss.

const (
	hotKey     = "system-prompt-block-0"
	hotSize    = 4 << 10
	hotReaders = 4
	hotRounds  = 3
)

// hotOutcome is what the readers saw.
type hotOutcome struct {
	reads, stale, wrong, misses, errs, afterRemove atomic.Int64
	firstBad                                       atomic.Value // string
}

func (o *hotOutcome) bad(counter *atomic.Int64, format string, args ...any) {
	counter.Add(1)
	o.firstBad.CompareAndSwap(nil, fmt.Sprintf(format, args...))
}

// TestHotReplicasFollowWrites must find no stale read. DFKV_E2E_HOT_BREAK=1 runs it with
// the servers' invalidation disabled (--hot-test-no-invalidate): it then fails, which is
// how the test was shown to catch a replica served after an overwrite.
func TestHotReplicasFollowWrites(t *testing.T) {
	breakIt := os.Getenv("DFKV_E2E_HOT_BREAK") == "1"
	o, madeBefore := runHotScenario(t, breakIt, false)
	t.Logf("reads %d, stale %d, wrong %d, misses %d, errors %d, reads after the remove %d; replica hits before each write %v",
		o.reads.Load(), o.stale.Load(), o.wrong.Load(), o.misses.Load(), o.errs.Load(), o.afterRemove.Load(), madeBefore)
	if n := o.stale.Load() + o.wrong.Load() + o.misses.Load() + o.errs.Load(); n != 0 {
		t.Fatalf("%d bad reads (stale %d, wrong bytes %d, misses %d, errors %d); first: %v",
			n, o.stale.Load(), o.wrong.Load(), o.misses.Load(), o.errs.Load(), o.firstBad.Load())
	}
}

// TestHotReplicasCheckerCatchesStale runs the same scenario with invalidation disabled and
// requires the checker to see stale reads: the test above would not notice a broken
// invalidation otherwise.
func TestHotReplicasCheckerCatchesStale(t *testing.T) {
	o, _ := runHotScenario(t, true, false)
	t.Logf("without invalidation: reads %d, stale %d, wrong %d", o.reads.Load(), o.stale.Load(), o.wrong.Load())
	if o.stale.Load() == 0 {
		t.Fatal("no stale read with replica invalidation disabled: the checker or the scenario lost its teeth")
	}
}

// TestHotReplicaPausedDuringOverwrite stops (SIGSTOP) a node holding a replica before the
// first overwrite: its invalidation cannot be delivered, so the write must wait out the
// replica's lease before its ack, and the node, resumed after the ack, must not serve the
// old bytes to anyone.
func TestHotReplicaPausedDuringOverwrite(t *testing.T) {
	o, _ := runHotScenario(t, false, true)
	t.Logf("reads %d, stale %d, wrong %d, misses %d, errors %d", o.reads.Load(), o.stale.Load(), o.wrong.Load(), o.misses.Load(), o.errs.Load())
	if n := o.stale.Load() + o.wrong.Load() + o.misses.Load() + o.errs.Load(); n != 0 {
		t.Fatalf("%d bad reads; first: %v", n, o.firstBad.Load())
	}
}

// runHotScenario runs the scenario; pause stops the first replica's node across the first
// overwrite (and checks that the write waited for its lease).
func runHotScenario(t *testing.T, noInvalidate, pause bool) (*hotOutcome, []float64) {
	const nodes = 3
	ports := make([]int, nodes)
	members := make([]string, nodes)
	cms := make([]client.Member, nodes)
	for i := range ports {
		ports[i] = freePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(ports[i])
		members[i] = fmt.Sprintf("n%d=%s", i+1, addr)
		cms[i] = client.Member{ID: fmt.Sprintf("n%d", i+1), Addr: addr, Weight: 1}
	}
	srvs := make([]*serverProc, nodes)
	for i := range srvs {
		args := []string{"--port", strconv.Itoa(ports[i]), "--cap", "64MiB", "--hot-spread", "--hot-members", strings.Join(members, ","),
			"--hot-interval", "200ms", "--hot-lease", "2s", "--hot-min-reads", "20", "--hot-max-replicas", "2"}
		if noInvalidate {
			args = append(args, "--hot-test-no-invalidate")
		}
		srvs[i] = startServer(t, t.TempDir(), args...)
	}
	newC := func() *client.Client {
		ms, err := client.NewStatic(cms)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(client.Options{Membership: ms, Namespace: []byte("e2e-hot"), IOTimeout: 10 * time.Second, Cooldown: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writer := newC()
	versions := make([][]byte, hotRounds+1)
	crcs := make([]uint32, hotRounds+1)
	for v := range versions {
		versions[v] = value(hotKey, v, hotSize)
		crcs[v] = crc32.ChecksumIEEE(versions[v])
	}
	var cold [][]byte
	for i := 0; i < 30; i++ {
		k := []byte(fmt.Sprintf("cold-%d", i))
		if err := writer.Put(ctx, k, value(string(k), 0, 512)); err != nil {
			t.Fatal(err)
		}
		cold = append(cold, k)
	}
	if err := writer.Put(ctx, []byte(hotKey), versions[0]); err != nil {
		t.Fatal(err)
	}
	// acked: the newest version whose PUT was acknowledged; removed: the REMOVE was
	// acknowledged; removing: it was sent.
	var acked atomic.Int64
	var removed, removing atomic.Bool
	o := &hotOutcome{}
	check := func(lower int64, wasRemoved bool, buf []byte, err error) {
		o.reads.Add(1)
		switch {
		case wasRemoved:
			o.afterRemove.Add(1)
			if !errors.Is(err, client.ErrNotFound) {
				o.bad(&o.stale, "read begun after the remove was acknowledged: err %v", err)
			}
		case errors.Is(err, client.ErrNotFound):
			if !removing.Load() {
				o.bad(&o.misses, "miss before any remove (last ack v%d)", lower)
			}
		case err != nil:
			o.bad(&o.errs, "read: %v", err)
		default:
			crc := crc32.ChecksumIEEE(buf)
			got := -1
			for v := range versions {
				if crc == crcs[v] && bytes.Equal(buf, versions[v]) {
					got = v
				}
			}
			switch {
			case got < 0:
				o.bad(&o.wrong, "bytes match no written version (crc %08x)", crc)
			case int64(got) < lower:
				o.bad(&o.stale, "read v%d after v%d was acknowledged", got, lower)
			}
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < hotReaders; r++ {
		c := newC()
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			buf := make([]byte, hotSize)
			cb := make([]byte, 512)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				lower, wasRemoved := acked.Load(), removed.Load()
				var err error
				if r%2 == 0 {
					err = c.Get(ctx, []byte(hotKey), buf)
				} else { // the batch path: the hot key with a cold one, as an engine's prefix read
					items := []client.Item{{Key: []byte(hotKey), Buf: buf}, {Key: cold[i%len(cold)], Buf: cb}}
					if err = c.BatchGet(ctx, items, client.Exact); err == nil {
						err = items[0].Err
					}
				}
				check(lower, wasRemoved, buf, err)
				if i%4 == 0 {
					_ = c.Get(ctx, cold[(i/4)%len(cold)], cb) // other reads for the heat's mean
				}
			}
		}(r)
	}
	replicaHits := func() float64 {
		n := 0.0
		for _, s := range srvs {
			n += s.metricLabeled("dfkv_server_hot_replica_reads_total", `result="hit"`)
		}
		return n
	}
	waitHits := func(above float64, what string) float64 {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if h := replicaHits(); h > above+50 {
				return h
			}
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				for _, s := range srvs {
					t.Logf("node %s: made %v tracked %v keys %v; log:\n%s", s.addr, s.metric("dfkv_server_hot_replicas_made_total"),
						s.metric("dfkv_server_hot_tracked_keys"), s.metric("dfkv_server_hot_keys"), s.log)
				}
				t.Fatalf("no replica served the hot key %s within 20s (replica hits %v)", what, replicaHits())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var madeBefore []float64
	h := waitHits(0, "at first")
	for v := 1; v <= hotRounds; v++ {
		madeBefore = append(madeBefore, h)
		var paused *serverProc
		if pause && v == 1 {
			owners := writer.View().Owners(writer.ID([]byte(hotKey)).Hi, 2)
			for _, s := range srvs {
				if len(owners) == 2 && s.addr == owners[1].Addr {
					paused = s
				}
			}
			if paused == nil {
				t.Fatalf("no node is the hot key's first replica (%v)", owners)
			}
			if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if err := writer.Put(ctx, []byte(hotKey), versions[v]); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		acked.Store(int64(v))
		if paused != nil {
			if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			// --hot-lease 2s: the write waits until the unreachable replica's lease has ended.
			if took < time.Second {
				t.Errorf("overwrite acknowledged after %v with a replica unreachable; want it to wait out the lease", took)
			}
			t.Logf("overwrite with a paused replica took %v", took)
		}
		h = waitHits(replicaHits(), fmt.Sprintf("after overwrite %d", v))
	}
	madeBefore = append(madeBefore, h)
	removing.Store(true)
	if err := writer.Remove(ctx, []byte(hotKey)); err != nil {
		t.Fatal(err)
	}
	removed.Store(true)
	time.Sleep(time.Second) // reads after the remove, while the replicas' leases would still run
	close(stop)
	wg.Wait()
	for _, s := range srvs { // servers built with -race report here
		if l := s.log.String(); strings.Contains(l, "DATA RACE") {
			t.Errorf("node %s reported a data race:\n%s", s.addr, l)
		}
	}
	if !noInvalidate {
		inv := 0.0
		for _, s := range srvs {
			inv += s.metric("dfkv_server_hot_replicas_invalidated_total")
		}
		if inv == 0 {
			t.Errorf("no replica was invalidated by %d overwrites and a remove", hotRounds)
		}
	}
	return o, madeBefore
}

// metricLabeled sums the samples of name whose labels contain label (e.g. `result="hit"`);
// 0 when none is exported yet (a labeled counter appears with its first increment).
func (s *serverProc) metricLabeled(name, label string) float64 {
	s.t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		s.t.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			v, _ := strconv.ParseFloat(line[i+1:], 64)
			total += v
		}
	}
	return total
}
