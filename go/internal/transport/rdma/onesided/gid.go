package onesided

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// hostAddrs lists this host's interface addresses (a seam: tests replace it).
var hostAddrs = func() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// connAddr is the IP of a net.Addr (invalid for addresses without one: pipes, unix).
func connAddr(a net.Addr) netip.Addr {
	if a == nil {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// onHost reports whether a is this host's: loopback, or one of its interfaces' addresses.
func onHost(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	if a.IsLoopback() {
		return true
	}
	for _, h := range hostAddrs() {
		if h == a {
			return true
		}
	}
	return false
}

// chooseGID picks this connection's source GID from the port's table and the bootstrap
// connection's addresses (verbs.ChooseGID); peer is the offer's rail on the answering side.
// A port whose table cannot be read keeps the pre-table behaviour: index 0.
func chooseGID(ctx verbs.Context, port verbs.PortInfo, boot net.Conn, pol verbs.GIDPolicy, peer *dcp.Rail) (verbs.GIDChoice, error) {
	table, err := ctx.GIDTable(port.Num)
	if err == nil && len(table) == 0 {
		err = errors.New("no entries")
	}
	if err != nil {
		if pol.HasIndex && pol.Index != 0 {
			return verbs.GIDChoice{}, fmt.Errorf("onesided: gid index %d set by the operator, but the GID table of %s port %d cannot be read: %w", pol.Index, ctx.Info().Name, port.Num, err)
		}
		return verbs.GIDChoice{Entry: verbs.GIDEntry{Index: 0, GID: port.GID}, Why: fmt.Sprintf("GID table unreadable (%v): index 0", err)}, nil
	}
	q := verbs.GIDQuery{LinkLayer: port.LinkLayer, Table: table}
	if boot != nil {
		q.Local = connAddr(boot.LocalAddr())
		remote := connAddr(boot.RemoteAddr())
		q.PeerLocal = onHost(remote) || (q.Local.IsValid() && q.Local.IsLoopback())
	}
	if peer != nil {
		q.Peer, q.PeerType, q.HasPeer = peer.GID, peer.GIDType, true
	}
	ch, err := verbs.ChooseGID(q, pol)
	if err != nil {
		return verbs.GIDChoice{}, fmt.Errorf("onesided: %s port %d: %w", ctx.Info().Name, port.Num, err)
	}
	return ch, nil
}
