package client

import (
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Reads of a hot key rotate over the primary and every replica the hint names, or over the
// replicas alone when the hint says SkipPrimary (the primary then knows the key's heat from
// its replicas' reports; a client that left it out on its own, before those existed, made it
// think the key cold: 3.1× the mean at 128 nodes); no hint, an expired one or a withdrawn
// one reads the primary.
func TestHotPick(t *testing.T) {
	id := identity.ObjectID{Hi: 7, Lo: 9}
	for _, tc := range []struct {
		replicas uint8
		skip     bool
		want     []int // copies that must all be read, and nothing else
	}{
		{0, false, []int{0}},
		{1, false, []int{0, 1}},
		{2, false, []int{0, 1, 2}},
		{127, false, nil}, // 0..127
		{4, true, []int{1, 2, 3, 4}},
		{127, true, nil}, // 1..127
	} {
		tab := newHotTable()
		tab.learn(id, wire.Hot{Replicas: tc.replicas, ValidMS: 60_000, SkipPrimary: tc.skip})
		want := tc.want
		if want == nil {
			for i := 0; i <= int(tc.replicas); i++ {
				if i > 0 || !tc.skip {
					want = append(want, i)
				}
			}
		}
		seen := map[int]int{}
		for range 64 * len(want) {
			idx, _ := tab.pick(id)
			seen[idx]++
		}
		for _, w := range want {
			if seen[w] == 0 {
				t.Errorf("replicas %d: copy %d never read (%v)", tc.replicas, w, seen)
			}
			delete(seen, w)
		}
		if len(seen) > 0 {
			t.Errorf("replicas %d: read copies %v outside %v", tc.replicas, seen, want)
		}
	}
	tab := newHotTable()
	tab.learn(id, wire.Hot{Replicas: 3, ValidMS: 1})
	time.Sleep(5 * time.Millisecond)
	if idx, _ := tab.pick(id); idx != 0 {
		t.Fatalf("expired hint: copy %d, want the primary", idx)
	}
	tab.learn(id, wire.Hot{Replicas: 3, ValidMS: 60_000})
	tab.learn(id, wire.Hot{})
	if idx, _ := tab.pick(id); idx != 0 {
		t.Fatalf("withdrawn hint: copy %d, want the primary", idx)
	}
}
