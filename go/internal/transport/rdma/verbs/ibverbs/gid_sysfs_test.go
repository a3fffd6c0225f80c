package ibverbs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// A fake sysfs port as the kernel lays it out: unset entries read as zeros and their
// type cannot be read.
func TestSysfsGIDTable(t *testing.T) {
	dir := t.TempDir()
	port := filepath.Join(dir, "rxe0", "ports", "1")
	for _, d := range []string{"gids", "gid_attrs/types", "gid_attrs/ndevs"} {
		os.MkdirAll(filepath.Join(port, d), 0o755)
	}
	w := func(rel, s string) { os.WriteFile(filepath.Join(port, rel), []byte(s), 0o644) }
	w("gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3401\n")
	w("gid_attrs/types/0", "RoCE v2\n")
	w("gid_attrs/ndevs/0", "eth1\n")
	w("gids/1", "0000:0000:0000:0000:0000:ffff:0a00:0102\n")
	w("gid_attrs/types/1", "RoCE v2\n")
	w("gid_attrs/ndevs/1", "eth1\n")
	w("gids/2", "0000:0000:0000:0000:0000:0000:0000:0000\n")
	w("gids/3", "0000:0000:0000:0000:0000:ffff:0a00:0103\n") // type unreadable: not in use
	w("gids/4", "garbage\n")
	w("gids/5", "fe80:0000:0000:0000:5054:00ff:fe12:3401\n")
	w("gid_attrs/types/5", "IB/RoCE v1\n")
	got, err := sysfsGIDTable(dir, "rxe0", 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	want := []verbs.GIDEntry{
		{Index: 0, GID: verbs.GID{0xfe, 0x80, 8: 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x01}, Type: verbs.GIDTypeRoCEv2, NetDev: "eth1"},
		{Index: 1, GID: verbs.GID{10: 0xff, 0xff, 10, 0, 1, 2}, Type: verbs.GIDTypeRoCEv2, NetDev: "eth1"},
		{Index: 5, GID: verbs.GID{0xfe, 0x80, 8: 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x01}, Type: verbs.GIDTypeIB},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := sysfsGIDTable(dir, "rxe0", 2, 8); err == nil {
		t.Fatal("a missing port read as a table")
	}
}
