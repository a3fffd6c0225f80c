package verbs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func gidOf(s string) GID { return GID(netip.MustParseAddr(s).As16()) }

// Tables as the kernel builds them: rxe (RoCE v2 only) and mlx5 (every address twice,
// v1 then v2), with the link-local default GID first.
var (
	rxeRouted = []GIDEntry{
		{0, gidOf("fe80::5054:ff:fe12:3401"), GIDTypeRoCEv2, "eth1"},
		{1, gidOf("::ffff:10.0.1.2"), GIDTypeRoCEv2, "eth1"},
	}
	mlx5Two = []GIDEntry{
		{0, gidOf("fe80::ba59:9fff:fe01:2"), GIDTypeIB, "ens1f0"},
		{1, gidOf("fe80::ba59:9fff:fe01:2"), GIDTypeRoCEv2, "ens1f0"},
		{2, gidOf("::ffff:192.168.7.5"), GIDTypeIB, "ens1f0"},
		{3, gidOf("::ffff:192.168.7.5"), GIDTypeRoCEv2, "ens1f0"},
		{4, gidOf("::ffff:192.168.9.5"), GIDTypeIB, "ens1f0"},
		{5, gidOf("::ffff:192.168.9.5"), GIDTypeRoCEv2, "ens1f0"},
		{6, gidOf("2001:db8::5"), GIDTypeRoCEv2, "ens1f0"},
	}
	linkLocalOnly = []GIDEntry{{0, gidOf("fe80::1"), GIDTypeRoCEv2, "eth0"}}
	ibPort        = []GIDEntry{{0, gidOf("fe80::2:c903:a:b"), GIDTypeIB, ""}, {1, gidOf("fe80::2:c903:a:c"), GIDTypeIB, ""}}
)

func TestChooseGID(t *testing.T) {
	a := netip.MustParseAddr
	cases := []struct {
		name    string
		q       GIDQuery
		pol     GIDPolicy
		want    int
		wantErr string
	}{
		{name: "routed client: the v2 GID of its address", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted, Local: a("10.0.1.2")}, want: 1},
		{name: "routed, IPv4 given as ::ffff form", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted, Local: a("::ffff:10.0.1.2")}, want: 1},
		{name: "routed server answers the v2 IPv4 offer with its own address", q: GIDQuery{LinkLayer: "Ethernet", Table: []GIDEntry{
			{0, gidOf("fe80::5054:ff:fe12:3402"), GIDTypeRoCEv2, "eth1"}, {1, gidOf("::ffff:10.0.2.1"), GIDTypeRoCEv2, "eth1"}},
			Local: a("10.0.2.1"), HasPeer: true, Peer: gidOf("::ffff:10.0.1.2"), PeerType: GIDTypeRoCEv2}, want: 1},
		{name: "one host, two NICs: link-local", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted, Local: a("10.0.1.2"), PeerLocal: true}, want: 0},
		{name: "loopback bootstrap (the peer is here): link-local", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("127.0.0.1"), PeerLocal: true}, want: 1},
		{name: "answering a link-local v2 peer", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("192.168.7.5"), HasPeer: true, Peer: gidOf("fe80::1"), PeerType: GIDTypeRoCEv2}, want: 1},
		{name: "answering a v1 peer keeps v1", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("192.168.9.5"), HasPeer: true, Peer: gidOf("::ffff:192.168.9.7"), PeerType: GIDTypeIB}, want: 4},
		{name: "answering an IPv4 peer from another address of the port", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("10.9.9.9"), HasPeer: true, Peer: gidOf("::ffff:192.168.9.7"), PeerType: GIDTypeRoCEv2}, want: 3},
		{name: "answering a peer that did not say its type: index 0 as before", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("192.168.7.5"), HasPeer: true, Peer: gidOf("fe80::1")}, want: 0},
		{name: "answering an IPv4 peer without an IPv4 GID fails plainly", q: GIDQuery{LinkLayer: "Ethernet", Table: linkLocalOnly, HasPeer: true, Peer: gidOf("::ffff:10.0.1.2"), PeerType: GIDTypeRoCEv2}, wantErr: "no GID of that version and family"},
		{name: "mlx5: v2 of the local address, not its v1 twin", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("192.168.9.5")}, want: 5},
		{name: "IPv6 local address", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("2001:db8::5")}, want: 6},
		{name: "rail not on the bootstrap's interface: the port's routable v2 GID", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("10.1.1.1")}, want: 3},
		{name: "address unknown (a pipe), no routable GID: link-local", q: GIDQuery{LinkLayer: "Ethernet", Table: linkLocalOnly}, want: 0},
		{name: "InfiniBand: the port GID", q: GIDQuery{LinkLayer: "InfiniBand", Table: ibPort, Local: a("10.0.0.1")}, want: 0},
		{name: "override", q: GIDQuery{LinkLayer: "Ethernet", Table: mlx5Two, Local: a("192.168.9.5")}, pol: GIDPolicy{HasIndex: true, Index: 2}, want: 2},
		{name: "override zero", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted, Local: a("10.0.1.2")}, pol: GIDPolicy{HasIndex: true, Index: 0}, want: 0},
		{name: "override not in the table", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted}, pol: GIDPolicy{HasIndex: true, Index: 7}, wantErr: "gid index 7 set by the operator is not in the port's GID table (valid: 0,1)"},
		{name: "override out of range", q: GIDQuery{LinkLayer: "Ethernet", Table: rxeRouted}, pol: GIDPolicy{HasIndex: true, Index: 256}, wantErr: "gid index 256 (0..255)"},
		{name: "empty table", q: GIDQuery{LinkLayer: "Ethernet"}, wantErr: "empty"},
		{name: "entries above 255 are not chosen", q: GIDQuery{LinkLayer: "Ethernet", Table: []GIDEntry{{300, gidOf("::ffff:10.0.1.2"), GIDTypeRoCEv2, ""}, {2, gidOf("fe80::9"), GIDTypeRoCEv2, ""}}, Local: a("10.0.1.2")}, want: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseGID(tc.q, tc.pol)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want ErrInvalid with %q (chose %+v)", err, tc.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Entry.Index != tc.want || got.Why == "" {
				t.Fatalf("chose %+v (%s), want index %d", got.Entry, got.Why, tc.want)
			}
		})
	}
}

func TestGIDPath(t *testing.T) {
	c := GIDChoice{Entry: GIDEntry{Index: 3}}
	if p := c.Path(GIDPolicy{}); p != (Path{SGIDIndex: 3, HopLimit: DefaultHopLimit}) {
		t.Fatalf("default path %+v", p)
	}
	if p := c.Path(GIDPolicy{HopLimit: 8, TrafficClass: 106}); p != (Path{SGIDIndex: 3, HopLimit: 8, TrafficClass: 106}) {
		t.Fatalf("path %+v", p)
	}
}

func TestParseGIDType(t *testing.T) {
	for in, want := range map[string]GIDType{"IB/RoCE v1\n": GIDTypeIB, "RoCE v2\n": GIDTypeRoCEv2, "": GIDTypeUnknown, "v3": GIDTypeUnknown} {
		if got := ParseGIDType(in); got != want {
			t.Errorf("%q: %v, want %v", in, got, want)
		}
	}
}
