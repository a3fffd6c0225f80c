//go:build linux

package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

// shippedTrace is the Mooncake FAST'25 conversation trace (testdata/traces/README.md).
const shippedTrace = "../../../testdata/traces/conversation_trace.jsonl.gz"

// tinyTrace has prefix hits worked out by hand (see TestTraceSimulationTiny).
const tinyTrace = `{"timestamp": 0, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 4]}
{"timestamp": 9, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]}

{"timestamp": 12, "input_length": 1536, "output_length": 10, "hash_ids": [5, 1, 2]}
{"timestamp": 20, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 21, "input_length": 3, "output_length": 10, "hash_ids": []}
{"timestamp": 30, "input_length": 512, "output_length": 10, "hash_ids": [4]}
`

func mustReadTrace(t *testing.T, s string) []traceRequest {
	t.Helper()
	reqs, err := readTrace(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestReadTrace(t *testing.T) {
	plain := mustReadTrace(t, tinyTrace)
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(tinyTrace))
	zw.Close()
	zipped := mustReadTrace(t, zb.String())
	if len(plain) != 7 || len(zipped) != 7 {
		t.Fatalf("%d plain and %d gzip requests, want 7 (the blank line skipped)", len(plain), len(zipped))
	}
	for i := range plain {
		if plain[i].Timestamp != zipped[i].Timestamp || len(plain[i].HashIDs) != len(zipped[i].HashIDs) {
			t.Fatalf("request %d differs between plain and gzip", i)
		}
	}
	if q := plain[1]; q.Timestamp != 5 || q.InputLength != 1536 || len(q.HashIDs) != 3 || q.HashIDs[2] != 4 {
		t.Fatalf("request 1 = %+v", q)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "no requests"},
		{"blank lines only", "\n\n", "no requests"},
		{"not json", `{"hash_ids": [1]}` + "\nhello\n", "line 2"},
		{"trailing data", `{"hash_ids": [1]} {"hash_ids": [2]}`, "trailing data"},
		{"negative id", `{"hash_ids": [-1]}`, "line 1"},
		{"wrong type", `{"hash_ids": "1,2"}`, "line 1"},
		{"negative timestamp", `{"timestamp": -4, "hash_ids": [1]}`, "negative timestamp"},
		{"broken gzip", "\x1f\x8b\x08garbage", "gzip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readTrace = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := loadTrace("testdata/no-such-trace.jsonl"); err == nil {
		t.Fatal("a missing file loaded")
	}
}

// The tiny trace by hand (LRU order oldest first after each request):
//
//	r1 [1 2 3]  miss miss miss              LRU3 {1 2 3}
//	r2 [1 2 4]  hit hit miss (evicts 3)     LRU3 {1 2 4}
//	r3 [1 2 3]  hit hit miss (evicts 4)     LRU3 {1 2 3}
//	r4 [5 1 2]  miss, then 1 and 2 stored   LRU3 {5 1 2} (5 evicts 1, 1 evicts 2, 2 evicts 3)
//	r5 [1 2 3]  hit hit miss                LRU3 {1 2 3}
//	r6 []
//	r7 [4]      miss                        LRU3 {2 3 4}
//
// LRU of 3 blocks: 2+2+2 = 6 hits. Infinite: r2 2, r3 3, r5 3, r7 1 = 9 (r4 misses at 5).
// LRU of 2: only r5 hits (1 and 2 were stored last by r4) = 2. LRU of 1: 0.
func TestTraceSimulationTiny(t *testing.T) {
	reqs := mustReadTrace(t, tinyTrace)
	f := factsOf(reqs)
	if f.Requests != 7 || f.BlockRefs != 16 || f.Distinct != 5 {
		t.Fatalf("facts %+v", f)
	}
	if got := maxHits(reqs); got != 9 {
		t.Errorf("infinite cache: %d hits, want 9", got)
	}
	for _, tc := range []struct {
		capacity int
		want     int64
	}{{0, 0}, {1, 0}, {2, 2}, {3, 6}, {5, 9}, {100, 9}} {
		if got := lruHits(reqs, tc.capacity); got != tc.want {
			t.Errorf("LRU of %d blocks: %d hits, want %d", tc.capacity, got, tc.want)
		}
	}
	// Partitioned: blocks 1 and 2 on node 0 (2 blocks), 3, 4 and 5 on node 1 (1 block).
	// r2 hits 1 2; r3 hits 1 2 (3 was evicted by 4); r4: 5 misses; r5 hits 1 2 (3 evicted
	// by 5); r7: 4 was evicted by 3 in r5. 6 hits, like the single LRU of 3.
	p := &partitionedCache{owner: map[uint64]int{1: 0, 2: 0, 3: 1, 4: 1, 5: 1}, nodes: []blockCache{newLRU(2), newLRU(1)}}
	if got := simulate(reqs, p); got != 6 {
		t.Errorf("partitioned LRU: %d hits, want 6", got)
	}
	// Node 0 of 1 block: 1 and 2 evict each other, so no request gets past block 1; only
	// r7's single block 4 hits (node 1 holds 3, 4 and 5).
	p = &partitionedCache{owner: map[uint64]int{1: 0, 2: 0, 3: 1, 4: 1, 5: 1}, nodes: []blockCache{newLRU(1), newLRU(3)}}
	if got := simulate(reqs, p); got != 1 {
		t.Errorf("partitioned LRU with a 1-block node 0: %d hits, want 1", got)
	}
}

// The simulation reproduces the reference figures of the trace's README.
func TestTraceSimulationMatchesReference(t *testing.T) {
	reqs, err := loadTrace(shippedTrace)
	if err != nil {
		t.Fatal(err)
	}
	f := factsOf(reqs)
	if f.Requests != 12031 || f.BlockRefs != 288500 || f.Distinct != 182790 {
		t.Fatalf("facts %+v, want 12031 requests, 288500 block references, 182790 distinct blocks", f)
	}
	pct := func(hits int64) float64 { return math.Round(1000*float64(hits)/float64(f.BlockRefs)) / 10 }
	if got := pct(maxHits(reqs)); got != 36.6 {
		t.Errorf("infinite cache: %.1f%%, want 36.6%%", got)
	}
	for _, tc := range []struct {
		fraction int
		capacity int
		want     float64
	}{{8, 22848, 30.1}, {16, 11424, 22.5}, {32, 5712, 13.2}} {
		if c := int(f.Distinct) / tc.fraction; c != tc.capacity {
			t.Fatalf("1/%d of the distinct blocks = %d, want %d", tc.fraction, c, tc.capacity)
		}
		if got := pct(lruHits(reqs, tc.capacity)); got != tc.want {
			t.Errorf("LRU of 1/%d (%d blocks): %.1f%%, want %.1f%%", tc.fraction, tc.capacity, got, tc.want)
		}
	}
}

// Belady's offline optimum on the tiny trace, worked out by hand (positions 0-15; a block
// whose next reference is farther than every cached block's is not stored): at 1 block, 1
// stays and hits in r2, r3, r5; at 2, 1 and 2 stay (6 hits, LRU's 2 thrash); at 3, 3 also
// hits in r3 and r5; at 4, 4 is kept for r7 as well, which only the infinite cache matches.
func TestBeladyTiny(t *testing.T) {
	reqs := mustReadTrace(t, tinyTrace)
	for _, tc := range []struct {
		capacity int
		want     int64
	}{{0, 0}, {1, 3}, {2, 6}, {3, 8}, {4, 9}, {100, 9}} {
		if got := beladyHits(reqs, tc.capacity); got != tc.want {
			t.Errorf("Belady of %d blocks: %d hits, want %d", tc.capacity, got, tc.want)
		}
	}
	// One block per request, 1 2 3 3 1 1 2 at 2 blocks: 3 (needed next) must evict 2 (needed
	// last), not 1: hits 3, 1, 1. LRU evicts 1 for 3, then 2 for 1: hits 3, 1.
	var single strings.Builder
	for _, id := range []int{1, 2, 3, 3, 1, 1, 2} {
		fmt.Fprintf(&single, "{\"timestamp\": 0, \"hash_ids\": [%d]}\n", id)
	}
	reqs = mustReadTrace(t, single.String())
	if got, lru := beladyHits(reqs, 2), lruHits(reqs, 2); got != 3 || lru != 2 {
		t.Errorf("1 2 3 3 1 1 2 at 2 blocks: Belady %d hits (want 3), LRU %d (want 2)", got, lru)
	}
}

// On the shipped trace Belady bounds every simulated policy from above at 1/32 ... 1/4 of
// the distinct blocks, and the infinite cache bounds it; the ratio to LRU is the headroom
// an eviction policy could still win (tools/bench report plots it).
func TestBeladyBoundsShippedTrace(t *testing.T) {
	reqs, err := loadTrace(shippedTrace)
	if err != nil {
		t.Fatal(err)
	}
	f := factsOf(reqs)
	inf := maxHits(reqs)
	for _, frac := range []int64{32, 16, 8, 4} {
		capBlocks := int(f.Distinct / frac)
		opt, lru := beladyHits(reqs, capBlocks), lruHits(reqs, capBlocks)
		clock := simulate(reqs, newClock(capBlocks, slabMaxRef, false))
		t.Logf("1/%d (%d blocks): belady %d, lru %d (x%.2f), clock %d, infinite %d", frac, capBlocks, opt, lru,
			float64(opt)/float64(lru), clock, inf)
		if opt < lru || opt < clock || opt > inf {
			t.Errorf("1/%d: belady %d hits outside [max(lru %d, clock %d), infinite %d]", frac, opt, lru, clock, inf)
		}
	}
}

func TestBlockFill(t *testing.T) {
	a, b, c := make([]byte, 1000), make([]byte, 1000), make([]byte, 1000)
	blockFill(a, 7)
	blockFill(b, 7)
	blockFill(c, 8)
	if !bytes.Equal(a, b) || bytes.Equal(a, c) || bytes.Equal(a[:8], a[8:16]) {
		t.Fatal("block contents must be a function of the id and differ between ids and words")
	}
	if got := string(blockKey(nil, 12345)); got != "blk-12345" {
		t.Fatalf("blockKey = %q", got)
	}
}

func TestTraceFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--trace", "x"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "--mds", "127.0.0.1:2"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "--block-bytes", "4"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "--speed", "-1"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "--speed", "2", "--as-fast-as-possible"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "stray"},
		{"--trace", "x", "--members", "n1=127.0.0.1:1", "--bogus"},
	} {
		var stderr bytes.Buffer
		if code := traceMain(args, io.Discard, &stderr); code != exitSetup || stderr.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want a setup error", args, code, stderr.String())
		}
	}
	var stderr bytes.Buffer
	if code := traceMain([]string{"--trace", "testdata/missing", "--members", "n1=127.0.0.1:1"}, io.Discard, &stderr); code != exitSetup {
		t.Errorf("missing trace file: exit %d", code)
	}
}

func startMemServer(t *testing.T, capacity int64) string {
	t.Helper()
	srv, err := server.New(server.Config{Engine: store.NewMem(capacity)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

func runTrace(t *testing.T, args ...string) (traceResult, int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := traceMain(append(args, "--json"), &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var r traceResult
	if len(lines) == 2 {
		if !strings.HasPrefix(lines[0], "trace: requests=") {
			t.Fatalf("first line %q", lines[0])
		}
		if err := json.Unmarshal([]byte(lines[1]), &r); err != nil {
			t.Fatalf("json %q: %v", lines[1], err)
		}
	}
	return r, code, stderr.String()
}

// The live replay of the tiny trace against a cache larger than the trace hits exactly
// what an infinite cache hits, and detects a block whose bytes are wrong.
func TestTraceReplayTiny(t *testing.T) {
	path := t.TempDir() + "/tiny.jsonl"
	if err := os.WriteFile(path, []byte(tinyTrace), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startMemServer(t, 64<<20)
	r, code, stderr := runTrace(t, "--trace", path, "--members", "n1="+addr, "--block-bytes", "4KiB", "--ns", "tiny")
	want := traceResult{Nodes: 1, Requests: 7, BlockRefs: 16, DistinctBlocks: 5, BlockBytes: 4096, PrefixHits: 9,
		LRUHits: 9, CapacityBlocks: 64 << 20 / 4096, CapacityBytes: 64 << 20, LiveBytes: 5 * 4096, Puts: 7, DiskReads: 9, NodeLRUHits: 9, BeladyHits: 9}
	got := r
	got.HitRatio, got.LRURatio, got.MaxRatio, got.Efficiency, got.VsLRU, got.Seconds = 0, 0, 0, 0, 0, 0
	got.NodeLRURatio, got.VsNodeLRU, got.BeladyRatio = 0, 0, 0
	if d := cmp.Diff(want, got); code != exitOK || d != "" || r.HitRatio != 9.0/16 || r.MaxRatio != 9.0/16 || r.VsLRU != 1 ||
		r.BeladyRatio != 9.0/16 {
		t.Fatalf("exit %d (%s) %+v; diff (-want +got):\n%s", code, stderr, r, d)
	}
	// --capacity-blocks sets the LRU's size; --limit replays a prefix of the trace.
	r, code, _ = runTrace(t, "--trace", path, "--members", "n1="+addr, "--block-bytes", "4KiB", "--ns", "tiny2",
		"--capacity-blocks", "3", "--limit", "5")
	// Belady at 3 blocks over the first 5 requests: 1 2 3 kept for r2, r3, r5 (by hand: 8).
	if code != exitOK || r.Requests != 5 || r.BlockRefs != 15 || r.LRUHits != 6 || r.PrefixHits != 8 || r.BeladyHits != 8 {
		t.Fatalf("capacity 3, 5 requests: exit %d %+v", code, r)
	}
	// --speed paces request starts by the timestamps (the last request starts at 30 ms).
	r, code, _ = runTrace(t, "--trace", path, "--members", "n1="+addr, "--block-bytes", "4KiB", "--ns", "paced", "--speed", "1")
	if code != exitOK || r.PrefixHits != 9 || r.Seconds < 0.030 {
		t.Fatalf("--speed 1: exit %d, %d hits in %.3fs (the trace spans 30 ms)", code, r.PrefixHits, r.Seconds)
	}
	// --min-ratio fails a replay that hits less than that share of LRU.
	if _, code, _ = runTrace(t, "--trace", path, "--members", "n1="+addr, "--block-bytes", "4KiB", "--ns", "tiny3",
		"--capacity-blocks", "3", "--limit", "5", "--min-ratio", "1.5"); code != exitFail {
		t.Fatalf("hit ratio 8/15 < 1.5 x 6/15 passed: exit %d", code)
	}

	// A block holding bytes that are not its own is counted, not served as a hit.
	ms, _ := client.NewStatic([]client.Member{{ID: "n1", Addr: addr, Weight: 1}})
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("bad"), IOTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(context.Background(), []byte("blk-1"), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	r, code, stderr = runTrace(t, "--trace", path, "--members", "n1="+addr, "--block-bytes", "4KiB", "--ns", "bad")
	if code != exitFail || r.Corrupt != 1 || r.PrefixHits != 9 || !strings.Contains(stderr, "wrong bytes") {
		t.Fatalf("planted bad block: exit %d %+v %s", code, r, stderr)
	}
	// An unreachable node is a setup error (its stats cannot be read), not a hang.
	if _, code, _ = runTrace(t, "--trace", path, "--members", "n1=127.0.0.1:1", "--block-bytes", "4KiB", "--io-timeout", "2s"); code != exitSetup {
		t.Fatalf("unreachable node: exit %d", code)
	}
}

// The slab's CLOCK model, step by step (hand positions in the comments).
func TestClockModel(t *testing.T) {
	has := func(c blockCache, want ...uint64) {
		t.Helper()
		cc := c.(*clockCache)
		if len(cc.idx) != len(want) {
			t.Fatalf("holds %v, want %v", cc.idx, want)
		}
		for _, id := range want {
			if _, ok := cc.idx[id]; !ok {
				t.Fatalf("holds %v, want %v", cc.idx, want)
			}
		}
	}
	// New values unreferenced: a read value survives the sweep, the unread one goes.
	c := newClock(2, 1, false)
	c.store(1)
	c.store(2)
	c.hit(1)
	c.store(3) // hand 0: 1 referenced, cleared; hand 1: 2 evicted
	has(c, 1, 3)
	c.store(4) // hand 0: 1 evicted (its bit was cleared)
	has(c, 3, 4)
	// Referenced on insert: everything survives one sweep, then the oldest goes.
	c = newClock(2, 1, true)
	c.store(1)
	c.store(2)
	c.store(3) // clears 1 and 2, evicts 1
	has(c, 2, 3)
	// A rewrite takes a new slot first (evicting the hand's victim), then frees its old
	// slot, which the next insert fills without evicting.
	c = newClock(3, 1, false)
	c.store(1)
	c.store(2)
	c.store(3)
	c.hit(1)
	c.store(3) // hand 0: 1 cleared; hand 1: 2 evicted, 3 moves to slot 1, slot 2 freed
	has(c, 1, 3)
	c.store(4) // slot 2, no eviction
	has(c, 1, 3, 4)
	c.store(5) // hand 2: 4 evicted
	has(c, 1, 3, 5)
	if c.hit(2) || c.hit(4) || !c.hit(5) {
		t.Fatal("hit reports the wrong blocks")
	}
	// Counted references (the slab's maxRef 3): a block read twice survives two passes of
	// the hand, one read once survives one.
	c = newClock(3, 3, false)
	c.store(1)
	c.store(2)
	c.store(3)
	c.hit(1)
	c.hit(1)
	c.hit(2)
	c.store(4) // hand 0: 1 (2→1); hand 1: 2 (1→0); hand 2: 3 evicted
	has(c, 1, 2, 4)
	c.store(5) // hand 0: 1 (1→0); hand 1: 2 evicted
	has(c, 1, 4, 5)
	c.store(6) // hand 2: 4 evicted (never read)
	has(c, 1, 5, 6)
	c.store(7) // hand 0: 1 evicted (its references are used up)
	has(c, 5, 6, 7)
	if z := newClock(0, slabMaxRef, false); func() bool { z.store(1); return z.hit(1) }() {
		t.Fatal("a zero-capacity cache holds a block")
	}
}

func TestSimulateFlag(t *testing.T) {
	var out, stderr bytes.Buffer
	path := t.TempDir() + "/tiny.jsonl"
	if err := os.WriteFile(path, []byte(tinyTrace), 0o600); err != nil {
		t.Fatal(err)
	}
	code := traceMain([]string{"--simulate", "--trace", path, "--capacity-blocks", "3",
		"--members", "n1=127.0.0.1:1,n2=127.0.0.1:2"}, &out, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{"policy=infinite capacity_blocks=3 hits=9 ", "policy=lru capacity_blocks=3 hits=6 ",
		"policy=belady capacity_blocks=3 hits=8 ", "policy=clock ", "policy=clock-bit ", "policy=clock-ref-on-insert ", "policy=node-lru ", "policy=node-clock ", "node_key_shares="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if code := traceMain([]string{"--simulate", "--trace", path}, io.Discard, io.Discard); code != exitSetup {
		t.Errorf("--simulate without --capacity-blocks: exit %d", code)
	}
}
