//go:build linux

package main

import (
	"testing"

	"github.com/dfkv/dfkv/go/internal/store/slab"
)

func TestAutoExtent(t *testing.T) {
	cases := []struct {
		share, maxValue, want int64
	}{
		// Large disks get the 256 MiB default.
		{1 << 40, 64 << 20, 256 << 20},
		// A small disk never goes below the largest value.
		{1 << 30, 64 << 20, 64 << 20},
		// With small values, extents shrink so every size class gets a few.
		{3 << 30, 4 << 20, ((3 << 30) / int64(extentsPerClass*len(slab.SizeClasses(4<<20)))) &^ 4095},
	}
	for _, c := range cases {
		got := autoExtent(c.share, c.maxValue)
		if got != c.want || got%4096 != 0 || got < c.maxValue {
			t.Errorf("autoExtent(%d, %d) = %d, want %d", c.share, c.maxValue, got, c.want)
		}
	}
}

func TestParseFlagsAndEnv(t *testing.T) {
	t.Setenv("DFKV_CAP", "2GiB")
	t.Setenv("DFKV_STORE_ENGINE", "file")
	o, err := parse([]string{"--store-engine", "slab", "--dir", "/a,/b", "--port", "0"})
	if err != nil {
		t.Fatal(err)
	}
	if o.engine != "slab" || int64(o.capacity) != 2<<30 || o.dirs != "/a,/b" || o.port != 0 {
		t.Fatalf("%+v", o)
	}
	if _, err := parse([]string{"stray"}); err == nil {
		t.Fatal("stray argument accepted")
	}
	if _, err := parse([]string{"--cap", "lots"}); err == nil {
		t.Fatal("bad size accepted")
	}
}
