package onesided

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Over the soft NIC the same selection runs: its one link-local RoCE v2 entry is chosen,
// its type travels in both tails, and the operator's hop limit and traffic class reach RTR.
func TestGIDChoiceOverSoft(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 1})
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2}, store.NewMem(1<<24))
	c, _ := dial(t, ts, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2, GID: verbs.GIDPolicy{TrafficClass: 106}})
	if got := c.tail.Rails[0].GIDType; got != verbs.GIDTypeRoCEv2 {
		t.Fatalf("server answered gid type %v", got)
	}
	if c.path != (verbs.Path{SGIDIndex: 0, HopLimit: verbs.DefaultHopLimit, TrafficClass: 106}) {
		t.Fatalf("client path %+v", c.path)
	}
	op := &Op{Kind: fb.OpPut, Tenant: 1, ID: oid(1), Value: [][]byte{[]byte("gid")}}
	if err := c.Do(t.Context(), []*Op{op}); err != nil || op.Status != fb.StatusOk {
		t.Fatalf("put over the chosen GID: %v %v", err, op.Status)
	}
}

// An operator's index the port lacks fails plainly on either side: the server refuses the
// bootstrap with the reason, the client does not send an offer it cannot connect.
func TestGIDIndexOverrideNotInTable(t *testing.T) {
	p := softProvider(t, soft.Options{Devices: 1})
	ts := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2, GID: verbs.GIDPolicy{HasIndex: true, Index: 1}}, store.NewMem(1<<24))
	boot, err := net.Dial("tcp", ts.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Dial(boot, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "gid index 1 set by the operator is not in the port's GID table (valid: 0)") {
		t.Fatalf("server with --rdma-gid-index 1: %v", err)
	}
	ts2 := startServer(t, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2}, store.NewMem(1<<24))
	boot2, err := net.Dial("tcp", ts2.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Dial(boot2, Config{Provider: p, Device: "soft0", MaxBlock: 1 << 20, Depth: 2, GID: verbs.GIDPolicy{HasIndex: true, Index: 3}})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "gid index 3") {
		t.Fatalf("client with GID index 3: %v", err)
	}
}

// gidCtx is a verbs.Context with a given GID table (only what chooseGID reads).
type gidCtx struct {
	verbs.Context
	table []verbs.GIDEntry
}

func (g gidCtx) Info() verbs.DeviceInfo                   { return verbs.DeviceInfo{Name: "rxe0"} }
func (g gidCtx) GIDTable(uint8) ([]verbs.GIDEntry, error) { return g.table, nil }
func (a addrConn) LocalAddr() net.Addr                    { return a.local }
func (a addrConn) RemoteAddr() net.Addr                   { return a.remote }
func tcpAddr(s string) net.Addr                           { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
func gid(s string) verbs.GID                              { return verbs.GID(netip.MustParseAddr(s).As16()) }
func setHostAddrs(t *testing.T, as ...string) {
	old := hostAddrs
	hostAddrs = func() []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	t.Cleanup(func() { hostAddrs = old })
}

type addrConn struct {
	net.Conn
	local, remote net.Addr
}

// The choice follows the bootstrap connection's addresses: across a router the IPv4-mapped
// GID of the local address, towards a peer on this host (loopback, or another local NIC's
// address) link-local; the answering side mirrors the offer.
func TestChooseGIDFromConnection(t *testing.T) {
	table := []verbs.GIDEntry{
		{Index: 0, GID: gid("fe80::5054:ff:fe12:3401"), Type: verbs.GIDTypeRoCEv2},
		{Index: 1, GID: gid("::ffff:10.0.1.2"), Type: verbs.GIDTypeRoCEv2},
	}
	ctx := gidCtx{table: table}
	port := verbs.PortInfo{Num: 1, LinkLayer: "Ethernet"}
	setHostAddrs(t, "10.0.1.2", "10.0.3.2")
	cases := []struct {
		name, local, remote string
		peer                *verbs.GID
		want                int
	}{
		{"routed: remote in another subnet", "10.0.1.2:5000", "10.0.2.1:7000", nil, 1},
		{"loopback bootstrap", "127.0.0.1:5000", "127.0.0.1:7000", nil, 0},
		{"one host, two NICs", "10.0.1.2:5000", "10.0.3.2:7000", nil, 0},
		{"answer to a link-local offer", "10.0.1.2:7000", "10.0.2.9:5000", &table[0].GID, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			boot := addrConn{local: tcpAddr(tc.local), remote: tcpAddr(tc.remote)}
			var peer *dcp.Rail
			if tc.peer != nil {
				peer = &dcp.Rail{GID: *tc.peer, GIDType: verbs.GIDTypeRoCEv2}
			}
			ch, err := chooseGID(ctx, port, boot, verbs.GIDPolicy{}, peer)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Entry.Index != tc.want {
				t.Fatalf("chose %+v (%s), want index %d", ch.Entry, ch.Why, tc.want)
			}
		})
	}
	if onHost(netip.Addr{}) || !onHost(netip.MustParseAddr("127.0.0.53")) || !onHost(netip.MustParseAddr("10.0.3.2")) || onHost(netip.MustParseAddr("10.0.2.1")) {
		t.Fatal("onHost")
	}
	if connAddr(pipeAddr{}).IsValid() {
		t.Fatal("a pipe has no IP")
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
