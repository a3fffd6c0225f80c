//go:build linux

package ramtier

import (
	"errors"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// A lease taken through the tier protects the disk copy through a storm that cycles the
// arena and the disk several times; a warm read from the arena consumes it.
func TestLeaseThroughTier(t *testing.T) {
	disk := openSlab(t)
	tr := newTier(t, disk, Config{ArenaBytes: 8 * mib, Shards: 2})
	const size = 256 * kib
	for i := range 4 {
		put(t, tr, key(i), val(i, size))
	}
	for i := range 2 {
		n, ok, err := store.Lease(tr, key(i), time.Minute)
		if err != nil || !ok || n != size {
			t.Fatalf("lease %d: n=%d ok=%v err=%v", i, n, ok, err)
		}
	}
	for i := 100; i < 100+4*64*mib/size; i++ { // four disks' worth
		put(t, tr, key(i), val(i, size))
	}
	if disk.Stats().Evictions == 0 {
		t.Fatal("no disk eviction")
	}
	for i := range 2 {
		if got := get(t, tr, key(i)); string(got) != string(val(i, size)) {
			t.Fatalf("leased key %d: wrong bytes", i)
		}
	}
	if _, err := disk.Stat(key(3)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unleased key survived four disks of writes: %v", err)
	}
	if st := tr.LeaseStats(); st.Active != 0 || st.Granted != 2 || st.Released != 2 {
		t.Fatalf("lease stats %+v", st)
	}
	// Warm path: write-through leaves the value in RAM, so this read never touches the disk
	// and must still end the disk copy's lease.
	put(t, tr, key(7), val(7, size))
	if _, ok, _ := store.Lease(tr, key(7), time.Minute); !ok {
		t.Fatal("lease refused")
	}
	reads := tr.RAMStats().Hits
	get(t, tr, key(7))
	if tr.RAMStats().Hits != reads+1 {
		t.Fatal("the read was not served warm")
	}
	if st := tr.LeaseStats(); st.Active != 0 {
		t.Fatalf("a warm read left the lease held: %+v", st)
	}
}
