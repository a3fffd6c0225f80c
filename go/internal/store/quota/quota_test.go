//go:build linux

package quota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/ramtier"
	"github.com/dfkv/dfkv/go/internal/store/slab"
)

func key(tenant uint64, i int) store.Key {
	return store.Key{ID: identity.ObjectID{Hi: uint64(i) + 1, Lo: uint64(i) * 31}, Tenant: tenant}
}

func put(e store.Engine, k store.Key, n int) error {
	return e.Put(k, n, func(d []byte) error { clear(d); return nil })
}

var (
	tenA = identity.Tenant([]byte("team-a"))
	tenB = uint64(0x8c1f3e2a9b4d5e60)
)

const limits = `
# tenant   bytes
team-a     100KiB   # by name
0x8c1f3e2a9b4d5e60 50K
default    20KiB
`

func TestParse(t *testing.T) {
	l, err := Parse(strings.NewReader(limits))
	if err != nil {
		t.Fatal(err)
	}
	if l.Default != 20<<10 || l.Tenants[tenA].Bytes != 100<<10 || l.Tenants[tenB].Bytes != 50<<10 || l.Tenants[tenA].Label != "team-a" {
		t.Fatalf("%+v", l)
	}
	for _, bad := range []string{"team 1 2", "team x", "other 5", "a 1\na 2", "a -1"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestQuotaPerTenant(t *testing.T) {
	l, _ := Parse(strings.NewReader(limits))
	mem := store.NewMem(0)
	q, err := Wrap(mem, l)
	if err != nil {
		t.Fatal(err)
	}
	// team-a: 100 KiB.
	for i := 0; i < 10; i++ {
		if err := put(q, key(tenA, i), 10<<10); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	filled := false
	err = q.Put(key(tenA, 10), 1, func([]byte) error { filled = true; return nil })
	if !errors.Is(err, store.ErrQuotaExceeded) || filled {
		t.Fatalf("over quota: err=%v filled=%v", err, filled)
	}
	// Overwriting a value with one of the same size stays within quota.
	if err := put(q, key(tenA, 3), 10<<10); err != nil {
		t.Fatalf("overwrite at quota: %v", err)
	}
	// Other tenants are unaffected; unlisted ones get the default.
	if err := put(q, key(tenB, 0), 50<<10); err != nil {
		t.Fatal(err)
	}
	if err := put(q, key(77, 0), 20<<10); err != nil {
		t.Fatal(err)
	}
	if err := put(q, key(78, 0), 20<<10+1); !errors.Is(err, store.ErrQuotaExceeded) {
		t.Fatalf("default quota: %v", err)
	}
	// Remove releases.
	if err := q.Remove(key(tenA, 0)); err != nil {
		t.Fatal(err)
	}
	if q.Used(tenA) != 90<<10 {
		t.Fatalf("used after remove %d", q.Used(tenA))
	}
	if err := put(q, key(tenA, 10), 10<<10); err != nil {
		t.Fatalf("put after remove: %v", err)
	}
	u := q.TenantUsage()
	if len(u) != 3 || u[0].Tenant != "0x8c1f3e2a9b4d5e60" || u[1].Tenant != "team-a" || u[2].Tenant != "other" ||
		u[1].UsedBytes != 100<<10 || u[1].Rejected != 1 || u[2].UsedBytes != 20<<10 || u[2].Rejected != 1 {
		t.Fatalf("usage %+v", u)
	}
}

// Evictions release quota, through a RAM tier and a slab engine, and usage is rebuilt
// from the disk after a restart.
func TestQuotaReleasedOnEvictionAndRebuilt(t *testing.T) {
	dir := t.TempDir()
	cfg := slab.Config{Dir: dir, CapacityBytes: 8 << 20, ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20}
	sl, err := slab.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ramtier.New(sl, ramtier.Config{ArenaBytes: 2 << 20, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	q, err := Wrap(tr, Limits{Default: 0})
	if err != nil {
		t.Fatal(err)
	}
	const n = 64 << 10
	for i := 0; i < 400; i++ { // 25 MiB through an 8 MiB disk
		if err := put(q, key(5, i), n); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if sl.Stats().Evictions == 0 {
		t.Fatal("no evictions")
	}
	var stored int64
	sl.ForEach(func(store.Key, int64) bool { stored += n; return true })
	if got := q.Used(5); got != stored {
		t.Fatalf("charged %d bytes, the disk holds %d", got, stored)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	sl2, err := slab.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sl2.Close()
	q2, err := Wrap(sl2, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := q2.Used(5); got != stored {
		t.Fatalf("after restart %d bytes charged, want %d", got, stored)
	}
}

func TestParseFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "q")
	os.WriteFile(p, []byte("x 1MiB\n"), 0o600)
	l, err := ParseFile(p)
	if err != nil || l.Tenants[identity.Tenant([]byte("x"))].Bytes != 1<<20 || l.Default != -1 {
		t.Fatal(l, err)
	}
	if _, err := ParseFile(p + "missing"); err == nil {
		t.Fatal("missing file accepted")
	}
	_ = fmt.Sprint()
}
