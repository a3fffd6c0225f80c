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
		// With small values, extents shrink so every size class gets a few: 4 MiB values have
		// 28 size classes, so 3 GiB / (4 × 28) = 28,760,941 bytes, rounded down to 4096.
		{3 << 30, 4 << 20, 28758016},
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

func TestAutoMaxValue(t *testing.T) {
	cases := []struct{ share, want int64 }{
		// Worked by hand from the size-class series (64/32/16/8/4 MiB values have 41/37/34/
		// 31/28 classes): 1 GiB with 16 MiB values is 64 extents for 34 classes (< 68); with
		// 8 MiB, 1 GiB / (4 × 31) gives 124 extents (>= 62). 256 MiB with 8 MiB values is 32
		// extents (< 62); with 4 MiB, 64 (>= 56).
		{1 << 30, 8 << 20},
		{256 << 20, 4 << 20},
		{64 << 30, 64 << 20},
		// 1 MiB values (22 classes) need 44 extents of at least 1 MiB: 48 MiB has 48, 16 MiB
		// does not and keeps the old 64 MiB default (and is refused at Open, as before).
		{48 << 20, 1 << 20},
		{16 << 20, 64 << 20},
		{1 << 20, 64 << 20},
	}
	for _, c := range cases {
		got := autoMaxValue(c.share)
		if got != c.want {
			t.Errorf("autoMaxValue(%d) = %d, want %d", c.share, got, c.want)
		}
		// Whatever it picks below the old default starts without the engine's warning.
		if got < 64<<20 || c.share >= 64<<30 {
			if n, classes := c.share/autoExtent(c.share, got), len(slab.SizeClasses(got)); n < 2*int64(classes) {
				t.Errorf("share %d: %d extents for %d classes", c.share, n, classes)
			}
		}
	}
}

func TestMaxMsgDefault(t *testing.T) {
	o, err := parse([]string{"--dir", "/a"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.maxMsgAuto || int64(o.maxMsg) != autoMaxValue(1<<30) {
		t.Fatalf("default max-msg %d auto=%v", int64(o.maxMsg), o.maxMsgAuto)
	}
	o, err = parse([]string{"--dir", "/a", "--max-msg", "64MiB"})
	if err != nil || o.maxMsgAuto || int64(o.maxMsg) != 64<<20 {
		t.Fatalf("explicit max-msg: %d auto=%v err=%v", int64(o.maxMsg), o.maxMsgAuto, err)
	}
	t.Setenv("DFKV_MAX_MSG", "32MiB")
	if o, err = parse([]string{"--dir", "/a"}); err != nil || o.maxMsgAuto || int64(o.maxMsg) != 32<<20 {
		t.Fatalf("DFKV_MAX_MSG: %d auto=%v err=%v", int64(o.maxMsg), o.maxMsgAuto, err)
	}
}
