package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// wbKey tracks one key's versions as a writer sees them: the last acknowledged version
// (-1 none) and the versions attempted since without an ack (they may or may not have been
// stored when the server died).
type wbKey struct {
	acked   int
	pending []int
}

// wbSize gives each (key, version) its own size, so a read tells the version apart by
// length as well as by bytes.
func wbSize(k, ver int) int { return 64<<10 + (k*37+ver*4096)%(448<<10) }

// checkLatestOrMiss asserts the crash contract: each key reads as its latest acknowledged
// version, a version attempted after it, or a miss; never an older version or wrong bytes.
// It returns how many keys read as their acked version and how many were misses.
func checkLatestOrMiss(t *testing.T, c *client.Client, name func(int) string, keys []wbKey) (same, misses int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for k, st := range keys {
		n, err := c.GetAuto(context.Background(), []byte(name(k)), buf)
		if errors.Is(err, client.ErrNotFound) {
			misses++
			continue
		}
		if err != nil {
			t.Fatalf("get %s: %v", name(k), err)
		}
		ok := false
		for _, ver := range append([]int{st.acked}, st.pending...) {
			if ver >= 0 && n == wbSize(k, ver) && bytes.Equal(buf[:n], value(name(k), ver, n)) {
				ok, same = true, same+boolInt(ver == st.acked)
				break
			}
		}
		if !ok {
			for ver := 0; ver < st.acked; ver++ {
				if n == wbSize(k, ver) && bytes.Equal(buf[:n], value(name(k), ver, n)) {
					t.Fatalf("%s: older version %d came back; latest acknowledged is %d", name(k), ver, st.acked)
				}
			}
			t.Fatalf("%s: %d bytes of no acknowledged or attempted version (acked %d, pending %v)", name(k), n, st.acked, st.pending)
		}
	}
	return same, misses
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// kill -9 in the middle of an 8-writer write-back storm that overwrites keys with
// versioned values: after the restart each key is its latest acknowledged version or a
// miss, never an older version and never wrong bytes.
func TestWriteBackKillDuringOverwriteStorm(t *testing.T) {
	if engine() == "mem" {
		t.Skip("the mem engine is not persistent")
	}
	dir := t.TempDir()
	s := startServer(t, dir, "--cap", "2GiB", "--max-msg", "4MiB", "--ram-tier", "--ram-tier-bytes", "64MiB",
		"--ram-tier-shards", "4", "--ram-tier-policy", "write-back", "--ram-tier-dirty-bytes", "16MiB",
		"--ram-tier-flush-threads", "2", "--ram-tier-dirty-wait-ms", "2000")
	c := newClient(t, s.addr)
	const writers, keysPer = 8, 24
	name := func(k int) string { return fmt.Sprintf("wb-%d", k) }
	keys := make([]wbKey, writers*keysPer)
	for i := range keys {
		keys[i].acked = -1
	}
	var stop atomic.Bool
	var acks, busy atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for ver := 0; !stop.Load() && ver < 10000; ver++ {
				for j := 0; j < keysPer && !stop.Load(); j++ {
					k := w*keysPer + j
					st := &keys[k] // owned by this writer until wg.Wait
					st.pending = append(st.pending, ver)
					err := c.Put(context.Background(), []byte(name(k)), value(name(k), ver, wbSize(k, ver)))
					switch {
					case err == nil:
						st.acked, st.pending = ver, st.pending[:0]
						acks.Add(1)
					case errors.Is(err, client.ErrBusy): // refused, nothing stored
						st.pending = st.pending[:len(st.pending)-1]
						busy.Add(1)
					default:
						return // the server died under us
					}
				}
			}
		}(w)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if acks.Load() >= int64(3*len(keys)) && s.metric("dfkv_ram_overwrite_tombstones_total") > 0 &&
			s.metric("dfkv_ram_flush_dropped_total")+s.metric("dfkv_ram_flushed_total") > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	dirty := s.metric("dfkv_ram_dirty_bytes")
	tomb := s.metric("dfkv_ram_overwrite_tombstones_total")
	flushed := s.metric("dfkv_ram_flushed_total")
	s.kill()
	stop.Store(true)
	wg.Wait()
	if tomb == 0 || flushed == 0 {
		t.Fatalf("the storm never overwrote a durable value (tombstones %v, flushed %v, %d acks)", tomb, flushed, acks.Load())
	}
	t.Logf("killed after %d acks (%d busy); %v dirty bytes, %v flushed, %v tombstones at the kill", acks.Load(), busy.Load(), dirty, flushed, tomb)
	s.start()
	c2 := newClient(t, s.addr)
	same, misses := checkLatestOrMiss(t, c2, name, keys)
	if same == 0 {
		t.Fatal("no key survived the kill: the check cannot tell versions apart")
	}
	t.Logf("after restart: %d keys at their latest acked version, %d misses of %d", same, misses, len(keys))
}

// With the flushers stalled (fault injection) the dirty budget fills: PUTs are refused
// (Busy) after a bounded wait, and SIGTERM with the budget full
// flushes every acknowledged write, overwrites of durable values included.
func TestWriteBackStalledFlusherBusyThenSIGTERMFlushesAll(t *testing.T) {
	if engine() == "mem" {
		t.Skip("the mem engine is not persistent")
	}
	dir := t.TempDir()
	base := []string{"--cap", "1GiB", "--max-msg", "4MiB", "--ram-tier", "--ram-tier-bytes", "64MiB",
		"--ram-tier-shards", "4", "--ram-tier-policy", "write-back", "--ram-tier-dirty-bytes", "8MiB",
		"--ram-tier-dirty-wait-ms", "100", "--log-level", "info"}
	name := func(k int) string { return fmt.Sprintf("stall-%d", k) }
	const old = 16
	// Phase 0: versions 0 of the first keys, made durable by a clean stop.
	s := startServer(t, dir, base...)
	c := newClient(t, s.addr)
	for k := 0; k < old; k++ {
		if err := c.Put(context.Background(), []byte(name(k)), value(name(k), 0, wbSize(k, 0))); err != nil {
			t.Fatal(err)
		}
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Phase 1: stalled flushers; overwrite those keys, then write new keys until refused.
	s.args = append(append([]string{}, base...), "--fault-stall-flush")
	s.start()
	c = newClient(t, s.addr)
	keys := make([]wbKey, 0, 256)
	for k := 0; k < old; k++ {
		if err := c.Put(context.Background(), []byte(name(k)), value(name(k), 1, wbSize(k, 1))); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, wbKey{acked: 1})
	}
	var refused int
	var longest time.Duration
	for k := old; k < 200 && refused < 4; k++ {
		start := time.Now()
		err := c.Put(context.Background(), []byte(name(k)), value(name(k), 0, wbSize(k, 0)))
		longest = max(longest, time.Since(start))
		switch {
		case err == nil:
			keys = append(keys, wbKey{acked: 0})
		case errors.Is(err, client.ErrBusy):
			refused++
			keys = append(keys, wbKey{acked: -1})
		default:
			t.Fatalf("put %d: %v", k, err)
		}
	}
	if refused == 0 {
		t.Fatal("the dirty budget never filled")
	}
	if longest > 10*time.Second {
		t.Fatalf("a PUT waited %v on the dirty budget (bound: 100ms wait)", longest)
	}
	if b := s.metric("dfkv_ram_dirty_busy_total"); b != float64(refused) {
		t.Fatalf("dfkv_ram_dirty_busy_total %v, %d refused", b, refused)
	}
	if d, f := s.metric("dfkv_ram_dirty_bytes"), s.metric("dfkv_ram_flushed_total"); d < 6<<20 || f != 0 {
		t.Fatalf("stalled: dirty %v bytes, flushed %v", d, f)
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(s.log.String(), "write-back drained") {
		t.Fatalf("no drain logged:\n%s", s.log)
	}
	// Phase 2: every acknowledged write is on disk at its latest version.
	s.args = base
	s.start()
	c = newClient(t, s.addr)
	same, misses := checkLatestOrMiss(t, c, name, keys)
	if want := len(keys) - refused; same != want || misses != refused {
		t.Fatalf("after SIGTERM drain: %d keys at their latest version (want %d), %d misses (want %d)", same, want, misses, refused)
	}
}

// kill -9 while overwrites of durable values are still dirty: those keys read as misses
// after the restart, never as the older durable version.
func TestWriteBackKillLeavesMissNotOlderVersion(t *testing.T) {
	if engine() == "mem" {
		t.Skip("the mem engine is not persistent")
	}
	dir := t.TempDir()
	base := []string{"--cap", "1GiB", "--max-msg", "4MiB", "--ram-tier", "--ram-tier-bytes", "32MiB",
		"--ram-tier-policy", "write-back"}
	name := func(k int) string { return fmt.Sprintf("old-%d", k) }
	const n = 24
	s := startServer(t, dir, base...)
	c := newClient(t, s.addr)
	for k := 0; k < n; k++ {
		if err := c.Put(context.Background(), []byte(name(k)), value(name(k), 0, wbSize(k, 0))); err != nil {
			t.Fatal(err)
		}
	}
	if code := s.stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.args = append(append([]string{}, base...), "--fault-stall-flush")
	s.start()
	c = newClient(t, s.addr)
	keys := make([]wbKey, n)
	for k := 0; k < n; k++ {
		if err := c.Put(context.Background(), []byte(name(k)), value(name(k), 1, wbSize(k, 1))); err != nil {
			t.Fatal(err)
		}
		keys[k].acked = 1
	}
	s.kill()
	s.args = base
	s.start()
	c = newClient(t, s.addr)
	same, misses := checkLatestOrMiss(t, c, name, keys)
	if same != 0 || misses != n {
		t.Fatalf("unflushed overwrites: %d survived, %d misses; want all %d misses", same, misses, n)
	}
}
