package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// kill -9 with the RAM tier on (write-through, coalescing): no acknowledged write is lost,
// and no GET, during the storm or after the restart, returns bytes that were not written.
func TestRAMTierKillDuringWriteStorm(t *testing.T) {
	if engine() == "mem" {
		t.Skip("the mem engine is not persistent")
	}
	dir := t.TempDir()
	flags := []string{"--cap", "2GiB", "--max-msg", "4MiB", "--ram-tier", "--ram-tier-bytes", "64MiB",
		"--ram-tier-shards", "4", "--read-coalesce"}
	s := startServer(t, dir, flags...)
	c := newClient(t, s.addr)
	before := preload(t, c, 60, 31)
	st := startStorm(c, 6, 77)
	// Readers hammer the pre-storm keys (warm, evicted and promoted again) while writing.
	var reads atomic.Int64
	var wrong atomic.Value
	for rd := 0; rd < 3; rd++ {
		st.also(func(stopped func() bool) {
			buf := make([]byte, 2<<20)
			for i := 0; !stopped(); i++ {
				b := before[(rd*17+i)%len(before)]
				n, err := c.GetAuto(context.Background(), []byte(b.key), buf)
				if err != nil {
					continue // the kill may land mid-request
				}
				reads.Add(1)
				if !bytes.Equal(buf[:n], value(b.key, 0, b.size)) {
					wrong.Store(b.key)
					return
				}
			}
		})
	}
	deadline := time.Now().Add(15 * time.Second)
	for (st.total.Load() < 200 || reads.Load() < 100) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	hits := s.metric("dfkv_ram_hits_total")
	s.kill()
	st.halt()
	if k := wrong.Load(); k != nil {
		t.Fatalf("GET of %s returned wrong bytes during the storm", k)
	}
	if st.total.Load() == 0 || hits == 0 {
		t.Fatalf("the storm wrote %d values and served %v RAM hits before the kill", st.total.Load(), hits)
	}
	t.Logf("killed after %d acknowledged storm writes (%d attempted), %d reads, %v RAM hits", len(st.acked), len(st.attempted), reads.Load(), hits)

	s.start()
	c2 := newClient(t, s.addr)
	check := func() int { return st.verify(t, c2, before) }
	// Twice: the first pass promotes from disk, the second is served from RAM.
	for pass := 0; pass < 2; pass++ {
		if lost := check(); lost > 0 {
			t.Fatalf("pass %d: %d acknowledged storm writes lost (write-through is durable before the ack)", pass, lost)
		}
	}
	if p := s.metric("dfkv_ram_promoted_total"); p == 0 {
		t.Fatal("nothing was promoted after the restart")
	}
}

// Over the real binary: warm GETs leave the device counters alone, tenant quotas answer
// QuotaExceeded, and the dfkv_ram_*, coalescing and quota families are exported.
func TestRAMTierWarmGetsAndQuota(t *testing.T) {
	if engine() == "mem" {
		t.Skip("device counters need a disk engine")
	}
	dir := t.TempDir()
	s := startServer(t, dir, "--cap", "256MiB", "--max-msg", "2MiB", "--ram-tier", "--ram-tier-bytes", "32MiB",
		"--read-coalesce", "--default-quota", "4MiB")
	c := newClient(t, s.addr)
	val := value("warm", 0, 1<<20)
	if err := c.Put(context.Background(), []byte("warm"), val); err != nil {
		t.Fatal(err)
	}
	reads := s.metric("dfkv_store_reads_total")
	buf := make([]byte, 1<<20)
	for i := 0; i < 20; i++ {
		if err := c.Get(context.Background(), []byte("warm"), buf); err != nil || !bytes.Equal(buf, val) {
			t.Fatalf("warm get: %v", err)
		}
	}
	if after := s.metric("dfkv_store_reads_total"); after != reads {
		t.Fatalf("warm GETs read the disk: %v -> %v device reads", reads, after)
	}
	if h := s.metric("dfkv_ram_hits_total"); h < 20 {
		t.Fatalf("dfkv_ram_hits_total = %v", h)
	}
	s.metric("dfkv_read_coalesce_leaders_total")
	s.metric("dfkv_ram_arena_bytes")
	// 4 MiB per tenant: the fifth 1 MiB value is refused, a remove makes room again.
	for i := 1; i < 4; i++ {
		if err := c.Put(context.Background(), []byte(fmt.Sprintf("q%d", i)), val); err != nil {
			t.Fatalf("put %d under quota: %v", i, err)
		}
	}
	if err := c.Put(context.Background(), []byte("q4"), val); !errors.Is(err, client.ErrQuotaExceeded) {
		t.Fatalf("put over quota: %v", err)
	}
	if err := c.Remove(context.Background(), []byte("q1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(context.Background(), []byte("q4"), val); err != nil {
		t.Fatalf("put after remove: %v", err)
	}
	if u := s.metric("dfkv_quota_used_bytes"); u != 4<<20 {
		t.Fatalf("dfkv_quota_used_bytes = %v", u)
	}
	if r := s.metric("dfkv_quota_rejected_total"); r != 1 {
		t.Fatalf("dfkv_quota_rejected_total = %v", r)
	}
}
