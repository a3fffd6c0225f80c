//go:build linux

package ramtier

import (
	"bytes"
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
)

// Values served warm from RAM never reach the disk engine, which must still count them
// as used (store.Toucher): otherwise its eviction drops the hottest values first, and the
// RAM copy with them.
func TestWarmHitsKeepDiskValuesHot(t *testing.T) {
	sl := openSlab(t) // 64 MiB of 1 MiB slots: 64 values
	tr := newTier(t, sl, Config{ArenaBytes: 128 * mib, Shards: 1})
	const size, n, hot = 1 * mib, 64, 24
	for i := range n {
		put(t, tr, key(i), val(i, size))
	}
	before := sl.Stats()
	for i := range hot { // the oldest values, next in the disk's CLOCK order
		if got := get(t, tr, key(i)); !bytes.Equal(got, val(i, size)) {
			t.Fatalf("key %d: wrong bytes", i)
		}
	}
	if after := sl.Stats(); after.Reads != before.Reads {
		t.Fatalf("the hot reads were not warm: %d disk reads", after.Reads-before.Reads)
	}
	for i := n; i < n+n/2; i++ { // evicts n/2 values from disk
		put(t, tr, key(i), val(i, size))
	}
	if ev := sl.Stats().Evictions; ev != n/2 {
		t.Fatalf("%d evictions, want %d", ev, n/2)
	}
	for i := range hot {
		if _, err := sl.Stat(key(i)); err != nil {
			t.Fatalf("hot key %d evicted from disk: %v", i, err)
		}
		if got := get(t, tr, key(i)); !bytes.Equal(got, val(i, size)) {
			t.Fatalf("hot key %d: wrong bytes", i)
		}
	}
	for i := hot; i < hot+n/2; i++ { // the next ones in CLOCK order, never read
		if _, err := sl.Stat(key(i)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("cold key %d still on disk (%v); the hot ones were evicted instead", i, err)
		}
	}
}
