package verbs

import (
	"fmt"
	"net/netip"
	"strings"
)

// GIDType is the kind of a GID table entry, as the kernel reports it
// (/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>, ibv_gid_entry.gid_type).
type GIDType uint8

// GID types. The numbering is the DCP tail's (QpInfo.gid_type): 0 = not said.
const (
	GIDTypeUnknown GIDType = 0
	GIDTypeIB      GIDType = 1 // "IB/RoCE v1": InfiniBand, or RoCE v1 on Ethernet
	GIDTypeRoCEv2  GIDType = 2 // "RoCE v2": UDP/IP encapsulated, routable
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeUnknown:
		return "unknown"
	case GIDTypeIB:
		return "IB/RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return fmt.Sprintf("GIDType(%d)", uint8(t))
}

// ParseGIDType reads the kernel's sysfs spelling ("IB/RoCE v1", "RoCE v2").
func ParseGIDType(s string) GIDType {
	switch strings.TrimSpace(s) {
	case "IB/RoCE v1", "IB", "RoCE v1":
		return GIDTypeIB
	case "RoCE v2":
		return GIDTypeRoCEv2
	}
	return GIDTypeUnknown
}

// GIDEntry is one valid entry of a port's GID table.
type GIDEntry struct {
	Index  int
	GID    GID
	Type   GIDType
	NetDev string // the Ethernet device the entry belongs to ("" when unknown or IB)
}

// DefaultHopLimit is the IPv6 hop limit / IPv4 TTL of RoCE v2 packets when the operator
// sets none: enough for any data-center fabric (the kernel takes the route's own hop limit
// for RoCE where it has one).
const DefaultHopLimit = 64

// Path is the local half of a QP's address vector (ibv_global_route): the source GID
// index, hop limit and traffic class (the DSCP/ECN byte lossless fabrics classify on). It
// is set at RTR.
type Path struct {
	SGIDIndex    uint8
	HopLimit     uint8 // 0 = DefaultHopLimit
	TrafficClass uint8
}

// GIDPolicy is the operator's part of the choice (--rdma-gid-index, --rdma-hop-limit,
// --rdma-traffic-class and their DFKV_* twins).
type GIDPolicy struct {
	// Index, when HasIndex, is the GID index to use on every connection (an override of the
	// automatic choice; an index the port's table lacks fails the connection).
	Index    int
	HasIndex bool
	HopLimit uint8 // 0 = DefaultHopLimit
	// TrafficClass is the IP header's DSCP<<2|ECN byte (e.g. 106 = DSCP 26 with ECT(0)).
	TrafficClass uint8
}

// GIDQuery is what one connection's choice depends on: the port's table and the
// addresses in use.
type GIDQuery struct {
	LinkLayer string // PortInfo.LinkLayer
	Table     []GIDEntry
	// Local is the local address of the connection's TCP bootstrap (the interface the
	// connection uses); invalid when unknown.
	Local netip.Addr
	// PeerLocal: the peer is on this host (a loopback or local address). Traffic between
	// two local interfaces cannot be IP-routed onto the fabric (the kernel routes it via
	// lo), so only link-local GIDs reach it.
	PeerLocal bool
	// Peer (the answering side) is the GID the peer chose and its type: the choice must be
	// of the same RoCE version and address family, or the packets are dropped.
	Peer     GID
	PeerType GIDType
	HasPeer  bool
}

// GIDChoice is the chosen source GID and why it was chosen (logged, and quoted in errors).
type GIDChoice struct {
	Entry GIDEntry
	Why   string
}

// Path returns the QP path for the choice under pol.
func (c GIDChoice) Path(pol GIDPolicy) Path {
	h := pol.HopLimit
	if h == 0 {
		h = DefaultHopLimit
	}
	return Path{SGIDIndex: uint8(c.Entry.Index), HopLimit: h, TrafficClass: pol.TrafficClass}
}

// MaxGIDIndex is the largest usable source GID index (ibv_global_route.sgid_index is a u8).
const MaxGIDIndex = 255

type gidFamily uint8

const (
	famOther     gidFamily = iota
	famLinkLocal           // fe80::/10
	famIPv4                // ::ffff:a.b.c.d
	famIPv6                // any other IPv6 (a global or unique-local address)
)

func (f gidFamily) String() string {
	return [...]string{"other", "link-local", "IPv4-mapped", "IPv6"}[f]
}

func familyOf(g GID) gidFamily {
	a := netip.AddrFrom16(g)
	switch {
	case a.Is4In6():
		return famIPv4
	case a.IsLinkLocalUnicast():
		return famLinkLocal
	case g.IsZero():
		return famOther
	}
	return famIPv6
}

// gidOfAddr is the GID an interface address appears as in a RoCE v2 GID table.
func gidOfAddr(a netip.Addr) (GID, bool) {
	if !a.IsValid() {
		return GID{}, false
	}
	return GID(a.Unmap().As16()), true
}

// ChooseGID picks the source GID for one connection (docs/RDMA.md §8):
//
//  1. the operator's index (GIDPolicy.HasIndex), which must be in the table;
//  2. InfiniBand: the port GID (the lowest index; LIDs route);
//  3. answering a peer: an entry of the peer's RoCE version and address family, the one
//     of the local address first (a peer that did not say its version gets the lowest
//     index, the behaviour before the version was carried);
//  4. a peer on this host: link-local (RoCE v2 before v1);
//  5. the RoCE v2 entry of the local address (IPv4-mapped for IPv4), so that the fabric can
//     route it between subnets;
//  6. another routable RoCE v2 entry (IPv4-mapped, then IPv6) of the port — a rail whose
//     interface is not the one the bootstrap took;
//  7. link-local, RoCE v2 before v1; else the lowest index.
//
// Entries above MaxGIDIndex are never chosen automatically.
func ChooseGID(q GIDQuery, pol GIDPolicy) (GIDChoice, error) {
	if len(q.Table) == 0 {
		return GIDChoice{}, fmt.Errorf("%w: the port's GID table is empty", ErrInvalid)
	}
	if pol.HasIndex {
		if pol.Index < 0 || pol.Index > MaxGIDIndex {
			return GIDChoice{}, fmt.Errorf("%w: gid index %d (0..%d)", ErrInvalid, pol.Index, MaxGIDIndex)
		}
		for _, e := range q.Table {
			if e.Index == pol.Index {
				return GIDChoice{Entry: e, Why: fmt.Sprintf("gid index %d set by the operator", pol.Index)}, nil
			}
		}
		return GIDChoice{}, fmt.Errorf("%w: gid index %d set by the operator is not in the port's GID table (valid: %s)", ErrInvalid, pol.Index, indexList(q.Table))
	}
	usable := make([]GIDEntry, 0, len(q.Table))
	for _, e := range q.Table {
		if e.Index >= 0 && e.Index <= MaxGIDIndex && !e.GID.IsZero() {
			usable = append(usable, e)
		}
	}
	if len(usable) == 0 {
		return GIDChoice{}, fmt.Errorf("%w: no usable GID (index 0..%d) in the port's table", ErrInvalid, MaxGIDIndex)
	}
	lowest := usable[0]
	for _, e := range usable {
		if e.Index < lowest.Index {
			lowest = e
		}
	}
	localGID, hasLocal := gidOfAddr(q.Local)
	pick := func(ok func(GIDEntry) bool) (GIDEntry, bool) {
		var best GIDEntry
		found := false
		for _, e := range usable {
			if ok(e) && (!found || e.Index < best.Index) {
				best, found = e, true
			}
		}
		return best, found
	}
	if q.LinkLayer != "" && q.LinkLayer != "Ethernet" {
		return GIDChoice{Entry: lowest, Why: "InfiniBand port GID"}, nil
	}
	if q.HasPeer {
		if q.PeerType == GIDTypeUnknown {
			return GIDChoice{Entry: lowest, Why: "the peer did not say its GID type: lowest index"}, nil
		}
		fam := familyOf(q.Peer)
		same := func(e GIDEntry) bool { return e.Type == q.PeerType && familyOf(e.GID) == fam }
		if hasLocal {
			if e, ok := pick(func(e GIDEntry) bool { return same(e) && e.GID == localGID }); ok {
				return GIDChoice{Entry: e, Why: fmt.Sprintf("%s of the local address %s, as the peer's", e.Type, q.Local)}, nil
			}
		}
		if e, ok := pick(same); ok {
			return GIDChoice{Entry: e, Why: fmt.Sprintf("%s %s, as the peer's", e.Type, fam)}, nil
		}
		return GIDChoice{}, fmt.Errorf("%w: the peer's GID %s is %s %s and this port has no GID of that version and family (table: %s)",
			ErrInvalid, q.Peer, q.PeerType, fam, describe(usable))
	}
	v2First := func(ok func(GIDEntry) bool) (GIDEntry, bool) {
		if e, found := pick(func(e GIDEntry) bool { return ok(e) && e.Type == GIDTypeRoCEv2 }); found {
			return e, true
		}
		return pick(ok)
	}
	linkLocal := func(e GIDEntry) bool { return familyOf(e.GID) == famLinkLocal }
	if q.PeerLocal {
		if e, ok := v2First(linkLocal); ok {
			return GIDChoice{Entry: e, Why: "link-local: the peer is on this host"}, nil
		}
	} else {
		if hasLocal {
			if e, ok := v2First(func(e GIDEntry) bool { return e.GID == localGID }); ok {
				return GIDChoice{Entry: e, Why: fmt.Sprintf("%s of the local address %s", e.Type, q.Local)}, nil
			}
		}
		for _, fam := range []gidFamily{famIPv4, famIPv6} {
			if e, ok := pick(func(e GIDEntry) bool { return e.Type == GIDTypeRoCEv2 && familyOf(e.GID) == fam }); ok {
				return GIDChoice{Entry: e, Why: fmt.Sprintf("RoCE v2 %s of the port", fam)}, nil
			}
		}
	}
	if e, ok := v2First(linkLocal); ok {
		return GIDChoice{Entry: e, Why: "link-local"}, nil
	}
	return GIDChoice{Entry: lowest, Why: "lowest index"}, nil
}

func indexList(t []GIDEntry) string {
	var b strings.Builder
	for i, e := range t {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", e.Index)
	}
	return b.String()
}

func describe(t []GIDEntry) string {
	var b strings.Builder
	for i, e := range t {
		if i == 8 {
			fmt.Fprintf(&b, " … %d more", len(t)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d %s %s", e.Index, e.GID, e.Type)
	}
	return b.String()
}
