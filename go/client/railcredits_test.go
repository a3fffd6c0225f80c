package client

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// orderRails: primary first, then NUMA-local rails, then the others, each group rotated
// round robin; NUMA off (node < 0) or unknown nodes make every rail "other".
func TestOrderRails(t *testing.T) {
	nodes := map[string]int{"r0": 0, "r1": 1, "r2": 0, "r3": 1, "r4": -1}
	for _, tc := range []struct {
		name    string
		cands   []string
		primary string
		rr      uint32
		node    int
		want    []string
	}{
		{"numa off", []string{"r0", "r1", "r2", "r3"}, "", 0, -1, []string{"r0", "r1", "r2", "r3"}},
		{"numa off rotated", []string{"r0", "r1", "r2", "r3"}, "", 1, -1, []string{"r1", "r2", "r3", "r0"}},
		{"node 1 first", []string{"r0", "r1", "r2", "r3"}, "", 0, 1, []string{"r1", "r3", "r0", "r2"}},
		{"node 1 rotated", []string{"r0", "r1", "r2", "r3"}, "", 1, 1, []string{"r3", "r1", "r2", "r0"}},
		{"node 0", []string{"r0", "r1", "r2", "r3"}, "", 0, 0, []string{"r0", "r2", "r1", "r3"}},
		{"primary beats locality", []string{"r0", "r1", "r2", "r3"}, "r0", 0, 1, []string{"r0", "r1", "r3", "r2"}},
		{"unknown node is not local", []string{"r4", "r1"}, "", 0, -1, []string{"r4", "r1"}},
		{"unknown node after local", []string{"r4", "r1"}, "", 0, 1, []string{"r1", "r4"}},
		{"no local rail in the tier", []string{"r0", "r2"}, "", 0, 1, []string{"r0", "r2"}},
		{"one rail", []string{"r3"}, "", 7, 0, []string{"r3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, orderRails(tc.cands, tc.primary, tc.rr, tc.node, nodes)); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestRailCreditsBudget(t *testing.T) {
	var rc railCredits
	if !rc.tryTake("a", 2) || !rc.tryTake("a", 2) {
		t.Fatal("budget 2 refused")
	}
	if rc.tryTake("a", 2) {
		t.Fatal("third credit of a budget of 2")
	}
	if !rc.tryTake("b", 2) {
		t.Fatal("rails share a budget")
	}
	w := rc.waitCh()
	select {
	case <-w:
		t.Fatal("woken before a release")
	default:
	}
	rc.release("a")
	select {
	case <-w:
	default:
		t.Fatal("release did not wake waiters")
	}
	if rc.used("a") != 1 || !rc.tryTake("a", 2) {
		t.Fatalf("after release: %d in use", rc.used("a"))
	}
	rc.release("c") // never taken: stays at zero
	if rc.used("c") != 0 {
		t.Fatal("negative credits")
	}
}

// splitReplay: reads always replay; writes only when never posted.
func TestSplitReplay(t *testing.T) {
	get := &onesided.Op{Kind: fb.OpGet, Posted: true}
	exist := &onesided.Op{Kind: fb.OpExist}
	putPosted := &onesided.Op{Kind: fb.OpPut, Posted: true}
	putNot := &onesided.Op{Kind: fb.OpPut}
	rmPosted := &onesided.Op{Kind: fb.OpRemove, Posted: true}
	rmNot := &onesided.Op{Kind: fb.OpRemove}
	replay, amb := splitReplay([]*onesided.Op{get, putPosted, exist, putNot, rmPosted, rmNot})
	if amb != 2 || len(replay) != 4 || replay[0] != get || replay[1] != exist || replay[2] != putNot || replay[3] != rmNot {
		t.Fatalf("replay %v, ambiguous %d", replay, amb)
	}
}
