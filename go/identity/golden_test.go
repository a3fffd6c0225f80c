package identity_test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/ring"
)

// The golden file is shared with the Python tests (python/tests). Inputs are hand-written;
// outputs come from testdata/golden/gen_golden.py, an independent implementation of the
// contract (hashlib only), never from this package: there is deliberately no -update flag.
// Outputs must never change once published.
const goldenPath = "../../testdata/golden/identity.json"

type goldenNode struct {
	ID     string `json:"id"`
	Weight uint32 `json:"weight"`
}

type goldenVector struct {
	Name         string          `json:"name"`
	Structured   json.RawMessage `json:"structured,omitempty"` // Python codec inputs, opaque to Go
	NamespaceHex string          `json:"namespace_hex"`
	KeyHex       string          `json:"key_hex"`
	TenantHex    string          `json:"tenant_hex"`
	ObjectID     string          `json:"object_id"`
	TenantHash   string          `json:"tenant_hash"`
	RingOwner    string          `json:"ring_owner"`     // the legacy 160-point placement ring
	Ring1024     string          `json:"ring1024_owner"` // the default placement ring
	DiskOwner    string          `json:"disk_owner"`
}

type goldenFile struct {
	Comment string         `json:"comment"`
	Ring    []goldenNode   `json:"ring"`
	Disks   []goldenNode   `json:"disks"`
	Vectors []goldenVector `json:"vectors"`
}

func compute(t *testing.T, g *goldenFile) []goldenVector {
	t.Helper()
	nodes := make([]ring.Node, len(g.Ring))
	for i, n := range g.Ring {
		nodes[i] = ring.Node{ID: n.ID, Weight: n.Weight}
	}
	r, err := ring.New(nodes, ring.WithPointsPerWeight(ring.LegacyPointsPerWeight))
	if err != nil {
		t.Fatal(err)
	}
	r1024, err := ring.New(nodes) // the default density
	if err != nil {
		t.Fatal(err)
	}
	disks := make([]ring.Node, len(g.Disks))
	for i, n := range g.Disks {
		disks[i] = ring.Node{ID: n.ID, Weight: n.Weight}
	}
	// The disk ring keeps the legacy density (go/internal/store/group).
	dr, err := ring.New(disks, ring.WithPointsPerWeight(ring.LegacyPointsPerWeight))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]goldenVector, len(g.Vectors))
	for i, v := range g.Vectors {
		ns, err1 := hex.DecodeString(v.NamespaceHex)
		key, err2 := hex.DecodeString(v.KeyHex)
		ten, err3 := hex.DecodeString(v.TenantHex)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("vector %q: bad hex", v.Name)
		}
		id := identity.Object(ns, key)
		v.ObjectID = id.String()
		v.TenantHash = fmt.Sprintf("%016x", identity.Tenant(ten))
		_, v.RingOwner = r.Owner(id.Hi)
		_, v.Ring1024 = r1024.Owner(id.Hi)
		_, v.DiskOwner = dr.Owner(id.Lo)
		out[i] = v
	}
	return out
}

func TestGolden(t *testing.T) {
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Vectors) < 8 {
		t.Fatalf("golden file has only %d vectors", len(g.Vectors))
	}
	got := compute(t, &g)
	for i, v := range g.Vectors {
		if got[i].ObjectID != v.ObjectID || got[i].TenantHash != v.TenantHash || got[i].RingOwner != v.RingOwner ||
			got[i].Ring1024 != v.Ring1024 || got[i].DiskOwner != v.DiskOwner {
			t.Errorf("vector %q: got id=%s tenant=%s owner=%s owner1024=%s disk=%s, golden id=%s tenant=%s owner=%s owner1024=%s disk=%s",
				v.Name, got[i].ObjectID, got[i].TenantHash, got[i].RingOwner, got[i].Ring1024, got[i].DiskOwner,
				v.ObjectID, v.TenantHash, v.RingOwner, v.Ring1024, v.DiskOwner)
		}
	}
}
