//go:build linux

package slab

import (
	"github.com/dfkv/dfkv/go/internal/vfs"

	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// legacyClasses is the series before powers of two were kept (every class 1.25x the
// previous, rounded up to 4 KiB): 64 KiB landed in a 76 KiB slot.
func legacyClasses(maxValue int64) []int64 {
	top := alignUp(max(maxValue, 1))
	classes := []int64{blockSize}
	for c := int64(blockSize); c < top; {
		c = min(alignUp(c+c/4), top)
		classes = append(classes, c)
	}
	return classes
}

func TestSizeClassesKeepPowersOfTwo(t *testing.T) {
	for _, maxValue := range []int64{64 * kib, 1*mib + 1, 64 * mib} {
		got := SizeClasses(maxValue)
		if !validClasses(got, maxValue) {
			t.Fatalf("SizeClasses(%d) = %v is not a valid series", maxValue, got)
		}
		for p := int64(blockSize); p <= maxValue; p *= 2 {
			if !slices.Contains(got, p) {
				t.Errorf("SizeClasses(%d) has no class of %d bytes: %v", maxValue, p, got)
			}
		}
	}
	// The old series really wasted power-of-two values (the reason for the change).
	if slices.Contains(legacyClasses(64*mib), 64*kib) {
		t.Fatal("legacy series unexpectedly holds 64 KiB")
	}
}

func TestValidClasses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		classes []int64
		max     int64
		ok      bool
	}{
		{"current", SizeClasses(mib), mib, true},
		{"legacy", legacyClasses(mib), mib, true},
		{"empty", nil, mib, false},
		{"not from 4 KiB", []int64{8192, mib}, mib, false},
		{"wrong top", SizeClasses(2 * mib), mib, false},
		{"unaligned", []int64{4096, 6000, mib}, mib, false},
		{"descending", []int64{4096, 16384, 8192, mib}, mib, false},
	} {
		if got := validClasses(tc.classes, tc.max); got != tc.ok {
			t.Errorf("%s: validClasses = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

// A directory formatted with the legacy series reopens with it: the values are intact
// and the superblock keeps the series it was formatted with.
func TestLegacyClassesAdopted(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	sizeClasses = legacyClasses
	e, err := Open(cfg)
	sizeClasses = SizeClasses
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1000, 64 * kib, 100 * kib, mib}
	for i, n := range sizes {
		mustPut(t, e, testKey(i), testValue(i, n))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	readClasses := func() []int64 {
		raw, err := os.ReadFile(filepath.Join(dir, metaName))
		if err != nil {
			t.Fatal(err)
		}
		var m meta
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		return m.Classes
	}
	if !slices.Equal(readClasses(), legacyClasses(cfg.MaxValueBytes)) {
		t.Fatal("legacy format did not record the legacy classes")
	}
	e = mustOpen(t, cfg) // today's series differs: the directory's own one is kept
	for i, n := range sizes {
		mustGet(t, e, testKey(i), testValue(i, n))
	}
	mustPut(t, e, testKey(9), testValue(9, 64*kib))
	mustGet(t, e, testKey(9), testValue(9, 64*kib))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(readClasses(), legacyClasses(cfg.MaxValueBytes)) {
		t.Fatal("Close rewrote the superblock with another class series")
	}
}

// Eviction order: values that were read (or touched by a tier above) since the last
// sweep survive; values written and never reused go first.
func TestUnreadValuesEvictedFirst(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 64 * kib
	slots := int(cfg.CapacityBytes / size) // one class, exact fit: 128 slots
	for i := range slots {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	if s := e.Stats(); s.Evictions != 0 || s.Objects != int64(slots) {
		t.Fatalf("filling exactly the capacity: %d objects, %d evictions", s.Objects, s.Evictions)
	}
	for i := 0; i < slots; i += 2 {
		if i%4 == 0 {
			mustGet(t, e, testKey(i), testValue(i, size)) // a read
		} else {
			e.Touch(testKey(i)) // a RAM-tier hit
		}
	}
	e.Touch(testKey(1 << 20)) // absent: ignored
	for i := slots; i < slots+slots/2; i++ {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	for i := 0; i < slots; i++ {
		if i%2 == 0 {
			mustGet(t, e, testKey(i), testValue(i, size))
		} else {
			mustNotFound(t, e, testKey(i))
		}
	}
	if s := e.Stats(); s.Evictions != int64(slots/2) {
		t.Fatalf("%d evictions, want %d", s.Evictions, slots/2)
	}
}

// References are counted (up to maxRef): a value read twice outlives one read once, which
// outlives a full revolution of the hand over unread values, and the count stops at maxRef.
func TestReadsCountedForEviction(t *testing.T) {
	cfg := testConfig(t.TempDir())
	e := mustOpen(t, cfg)
	const size = 64 * kib
	slots := int(cfg.CapacityBytes / size) // 128 slots of one class
	for i := range slots {
		mustPut(t, e, testKey(i), testValue(i, size))
	}
	// Key 0 read twice, key 1 once, key 2 ten times (capped at maxRef), the rest never.
	for range 2 {
		mustGet(t, e, testKey(0), testValue(0, size))
	}
	mustGet(t, e, testKey(1), testValue(1, size))
	for range 10 {
		e.Touch(testKey(2))
	}
	// Stat does not reference a value, so it observes the CLOCK without changing it.
	present := func(i int) bool { _, err := e.Stat(testKey(i)); return err == nil }
	next := slots
	putUntilGone := func(i int) int {
		t.Helper()
		n := 0
		for present(i) {
			if n > 10*slots {
				t.Fatalf("key %d survived %d puts", i, n)
			}
			mustPut(t, e, testKey(next), testValue(next, size))
			next++
			n++
		}
		return n
	}
	putUntilGone(1)
	// Evictions come in batches (several victims per commit), so count survivors rather
	// than puts: by the time the value read once goes, every unread original is gone.
	for i := 3; i < slots; i++ {
		if present(i) {
			t.Fatalf("the key read once went while unread key %d is still cached", i)
		}
	}
	if !present(0) || !present(2) {
		t.Fatal("the keys read more often went first")
	}
	putUntilGone(0)
	if !present(2) {
		t.Fatal("the key read ten times went before the one read twice")
	}
	putUntilGone(2)
	if total := next - slots; total >= (maxRef+1)*slots {
		t.Fatalf("the key read ten times survived %d puts: references are not capped at %d", total, maxRef)
	}
}

// A superblock whose class series is not a valid one for the configuration is refused,
// not adopted.
func TestInvalidDiskClassesRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	e := mustOpen(t, cfg)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, metaName)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m meta
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m.Classes = []int64{4096, 8192, 12288} // does not reach the max value
	if err := writeMeta(vfs.Default, dir, m); err != nil {
		t.Fatal(err)
	}
	if e, err := Open(cfg); err == nil {
		e.Close()
		t.Fatal("Open adopted an invalid class series")
	} else if !strings.Contains(err.Error(), "size classes differ") {
		t.Fatalf("Open = %v, want it to name the size classes", err)
	}
}
