//go:build linux

package slab

import (
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
)

// Has agrees with Stat (present, absent, removed) and fails with ErrClosed once closed;
// store.Has gives the same answers through it.
func TestHasAgreesWithStat(t *testing.T) {
	e := mustOpen(t, testConfig(t.TempDir()))
	mustPut(t, e, testKey(1), testValue(1, 5000))
	mustPut(t, e, testKey(2), testValue(2, 5000))
	if err := e.Remove(testKey(2)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  store.Key
		want bool
	}{{"present", testKey(1), true}, {"never written", testKey(3), false}, {"removed", testKey(2), false}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.Has(tc.key)
			_, serr := e.Stat(tc.key)
			if err != nil || got != tc.want || got != (serr == nil) {
				t.Fatalf("Has = %v, %v; want %v (Stat: %v)", got, err, tc.want, serr)
			}
			if sg, err := store.Has(e, tc.key); err != nil || sg != tc.want {
				t.Fatalf("store.Has = %v, %v; want %v", sg, err, tc.want)
			}
		})
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Has(testKey(1)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Has after Close: %v, want ErrClosed", err)
	}
}
