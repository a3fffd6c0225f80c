//go:build linux

package group

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/file"
	"github.com/dfkv/dfkv/go/internal/store/slab"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func key(i int) store.Key {
	id := identity.Object([]byte("ns"), []byte{byte(i), byte(i >> 8), byte(i >> 16)})
	return store.Key{ID: id, Tenant: 1}
}

func TestRoutesByLowBits(t *testing.T) {
	mems := make([]store.Engine, 12) // 12 disks: "disk10" sorts before "disk2"
	for i := range mems {
		mems[i] = store.NewMem(0)
	}
	g, err := New(mems)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(mems))
	const n = 12000
	for i := range n {
		k := key(i)
		d := g.Route(k)
		counts[d]++
		// Same Lo, different Hi: same disk. The Hi bits must not matter.
		k2 := k
		k2.ID.Hi ^= 0xffff0000ffff
		if g.Route(k2) != d {
			t.Fatal("route depends on the high bits")
		}
		if err := g.Put(k, 3, func(b []byte) error { copy(b, "abc"); return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := mems[d].Stat(k); err != nil {
			t.Fatalf("key %d not on disk %d", i, d)
		}
	}
	for d, c := range counts {
		if math.Abs(float64(c)-n/12) > n/12*0.5 {
			t.Fatalf("disk %d got %d of %d keys: %v", d, c, n, counts)
		}
	}
	if s := g.Stats(); s.Objects != n || s.Engine != "mem" {
		t.Fatalf("Stats = %+v", s)
	}
}

func TestOpenDirsSlab(t *testing.T) {
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")}
	opts := Options{Dirs: dirs, CapacityBytes: 3 * 8 << 20,
		Slab: slab.Config{ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20, BufferPoolBytes: 4 << 20}, Logger: quiet}
	g, err := OpenDirs(opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		v := bytes.Repeat([]byte{byte(i)}, 5000+i)
		if err := g.Put(key(i), len(v), func(b []byte) error { copy(b, v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	s := g.Stats()
	if s.Engine != "slab" || s.Objects != 60 || s.CapacityBytes != 3*8<<20 || !s.Healthy {
		t.Fatalf("Stats = %+v", s)
	}
	for _, m := range g.Members() {
		if m.Stats().Objects == 0 {
			t.Fatal("a disk got no keys")
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g, err = OpenDirs(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := range 60 {
		var got []byte
		if err := g.Get(key(i), func(v []byte) error { got = bytes.Clone(v); return nil }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, 5000+i)) {
			t.Fatalf("key %d: wrong bytes", i)
		}
	}
	if err := g.Remove(key(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Stat(key(0)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Stat after Remove = %v", err)
	}
}

func TestOpenDirsErrors(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	base := Options{Slab: slab.Config{ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20}, Logger: quiet}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no dirs", func(o *Options) {}, "no directories"},
		{"duplicate", func(o *Options) { o.Dirs, o.CapacityBytes = []string{a, a}, 16<<20 }, "twice"},
		{"share below an extent", func(o *Options) { o.Dirs, o.CapacityBytes = []string{a, b}, 1<<20 }, "disk0"},
		{"unknown engine", func(o *Options) { o.Dirs, o.CapacityBytes, o.Engine = []string{a}, 8<<20, "tape" }, "unknown engine"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			g, err := OpenDirs(o)
			if err == nil {
				g.Close()
				t.Fatal("OpenDirs succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// The second disk fails (its directory is locked by another engine): the first one
	// must be closed again, so it can be reopened.
	held, err := slab.Open(slab.Config{Dir: b, CapacityBytes: 8 << 20, ExtentBytes: 1 << 20, MaxValueBytes: 1 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	o := base
	o.Dirs, o.CapacityBytes = []string{a, b}, 16<<20
	if g, err := OpenDirs(o); err == nil || !strings.Contains(err.Error(), "disk1") {
		if g != nil {
			g.Close()
		}
		t.Fatalf("OpenDirs with a locked disk = %v", err)
	}
	held.Close()
	g, err := OpenDirs(o)
	if err != nil {
		t.Fatalf("reopen after failure: %v", err)
	}
	g.Close()
}

func TestOpenDirsFile(t *testing.T) {
	root := t.TempDir()
	g, err := OpenDirs(Options{Engine: "file", Dirs: []string{filepath.Join(root, "x"), filepath.Join(root, "y")},
		CapacityBytes: 4 << 20, Logger: quiet, File: fileCfg()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Put(key(1), 10, func(b []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.Engine != "file" || s.Objects != 1 || s.CapacityBytes != 4<<20 {
		t.Fatalf("Stats = %+v", s)
	}
}

func fileCfg() file.Config { return file.Config{MaxValueBytes: 1 << 20} }

// statless answers Has but fails Stat: Has on a group must reach a member's Haser.
type statless struct{ store.Engine }

func (statless) Stat(store.Key) (int64, error) { return 0, errors.New("Stat called") }
func (s statless) Has(k store.Key) (bool, error) {
	_, err := s.Engine.Stat(k)
	return err == nil, nil
}

func TestHasUsesMembersHaser(t *testing.T) {
	mems := []store.Engine{statless{store.NewMem(0)}, statless{store.NewMem(0)}}
	g, err := New(mems)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		k := key(i)
		if has, err := store.Has(g, k); has || err != nil {
			t.Fatalf("key %d before Put: Has = %v, %v", i, has, err)
		}
		if err := g.Put(k, 1, func(b []byte) error { b[0] = 1; return nil }); err != nil {
			t.Fatal(err)
		}
		if has, err := store.Has(g, k); !has || err != nil {
			t.Fatalf("key %d after Put: Has = %v, %v", i, has, err)
		}
	}
}
