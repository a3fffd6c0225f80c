//go:build linux

package ramtier

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
)

// A flush must never publish a value older than one already acknowledged: at every moment
// the disk (what a crash leaves) holds, for each key, a version at least as new as the
// latest acknowledged one, or nothing. Flushers run at once (no deferral) and each one
// pauses between checking its slots current and writing them, so overwrites of the same
// keys race every flush; a checker reads the backing engine directly throughout.
func TestWriteBackFlushNeverPublishesOlderThanAcked(t *testing.T) {
	flushCheckedHook = func() {
		if d := rand.IntN(3); d > 0 {
			time.Sleep(time.Duration(d) * 300 * time.Microsecond)
		}
	}
	defer func() { flushCheckedHook = nil }()
	dir := t.TempDir()
	tr, disk := newWB(t, dir, Config{ArenaBytes: 8 * mib, Shards: 2, DirtyBytes: 2 * mib, FlushThreads: 4,
		FlushDefer: -1, DirtyWait: 5 * time.Second})
	const writers, keysPer, versions = 4, 2, 400
	nkeys := writers * keysPer
	acked := make([]atomic.Int32, nkeys) // latest acknowledged version + 1 (0: none yet)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ver := range versions {
				k := w*keysPer + ver%keysPer
				v := versionVal(k, ver)
				if err := tr.Put(key(k), len(v), func(d []byte) error { copy(d, v); return nil }); err != nil {
					t.Errorf("put key %d version %d: %v", k, ver, err)
					return
				}
				acked[k].Store(int32(ver + 1))
			}
		}()
	}
	var checks, older atomic.Int64
	var cwg sync.WaitGroup
	for c := range 2 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for i := c; !stop.Load(); i++ {
				k := i % nkeys
				floor := int(acked[k].Load()) - 1 // read before the disk: the disk may only be newer
				err := disk.Get(key(k), func(v []byte) error {
					ver := int(v[0]) | int(v[1])<<8
					if ver >= versions || !bytes.Equal(v, versionVal(k, ver)) {
						t.Errorf("key %d: the disk holds bytes of no version", k)
					} else if ver < floor {
						older.Add(1)
						t.Errorf("key %d: the disk holds version %d after version %d was acknowledged", k, ver, floor)
					}
					return nil
				})
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					t.Errorf("read the disk: %v", err)
				}
				checks.Add(1)
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	cwg.Wait()
	rs := tr.RAMStats()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if older.Load() > 0 {
		t.Fatalf("%d disk reads found a version older than the acknowledged one", older.Load())
	}
	// The race must have been exercised: flushes happened and some were overtaken.
	if rs.Flushed == 0 || rs.Tombstones == 0 {
		t.Fatalf("the overwrites never raced a flush: %+v", rs)
	}
	t.Logf("%d disk checks; flushed %d, dropped unwritten %d, older versions removed before ack %d",
		checks.Load(), rs.Flushed, rs.FlushDropped, rs.Tombstones)
	for k := range nkeys {
		want := int(acked[k].Load()) - 1
		got, err := diskValue(t, dir, key(k))
		if err != nil || !bytes.Equal(got, versionVal(k, want)) {
			t.Fatalf("after drain, key %d is not its last version %d (%v)", k, want, err)
		}
	}
}
