package ibverbs

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// sysfsGIDTable reads a port's GID table from sysfs (<class>/<dev>/ports/<port>/gids/<i>,
// gid_attrs/types/<i>, gid_attrs/ndevs/<i>) for i < n: the fallback where the library has
// no ibv_query_gid_table. Unset entries (all-zero GIDs, or a type the kernel will not
// read) are left out.
func sysfsGIDTable(class, dev string, port uint8, n int) ([]verbs.GIDEntry, error) {
	dir := filepath.Join(class, dev, "ports", fmt.Sprint(port))
	if _, err := os.Stat(filepath.Join(dir, "gids")); err != nil {
		return nil, fmt.Errorf("ibverbs: %s port %d GID table: %w", dev, port, err)
	}
	var out []verbs.GIDEntry
	for i := range n {
		b, err := os.ReadFile(filepath.Join(dir, "gids", fmt.Sprint(i)))
		if err != nil {
			continue
		}
		g, ok := parseSysfsGID(string(b))
		if !ok || g.IsZero() {
			continue
		}
		e := verbs.GIDEntry{Index: i, GID: g}
		if t, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "types", fmt.Sprint(i))); err == nil {
			e.Type = verbs.ParseGIDType(string(t))
		} else {
			continue // the kernel refuses the type of an entry that is not in use
		}
		if nd, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "ndevs", fmt.Sprint(i))); err == nil {
			e.NetDev = strings.TrimSpace(string(nd))
		}
		out = append(out, e)
	}
	return out, nil
}

// parseSysfsGID reads "fe80:0000:0000:0000:5054:00ff:fe12:3456".
func parseSysfsGID(s string) (verbs.GID, bool) {
	h := strings.ReplaceAll(strings.TrimSpace(s), ":", "")
	var g verbs.GID
	if len(h) != 32 {
		return g, false
	}
	if _, err := hex.Decode(g[:], []byte(h)); err != nil {
		return g, false
	}
	return g, true
}

// gidTypeOf maps enum ibv_gid_type (IB 0, RoCE v1 1, RoCE v2 2).
func gidTypeOf(t uint32) verbs.GIDType {
	switch t {
	case 0, 1:
		return verbs.GIDTypeIB
	case 2:
		return verbs.GIDTypeRoCEv2
	}
	return verbs.GIDTypeUnknown
}
