package client

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/dfkv/dfkv/go/ring"
)

// Member is one cache node.
type Member struct {
	ID     string
	Addr   string // host:port
	Weight uint32
}

// View is an immutable routing snapshot.
type View struct {
	Members []Member // sorted by id, index-aligned with Ring.Nodes()
	Ring    *ring.Ring
	Epoch   uint64
}

// NewView builds a view over members. Options set the ring's density (ring.WithPointsPerWeight);
// every client of a cluster must build its views alike.
func NewView(members []Member, epoch uint64, opts ...ring.Option) (*View, error) {
	nodes := make([]ring.Node, len(members))
	for i, m := range members {
		if _, _, err := net.SplitHostPort(m.Addr); err != nil {
			return nil, fmt.Errorf("dfkv: member %q address %q: %w", m.ID, m.Addr, err)
		}
		nodes[i] = ring.Node{ID: m.ID, Weight: m.Weight}
	}
	r, err := ring.New(nodes, opts...)
	if err != nil {
		return nil, fmt.Errorf("dfkv: %w", err)
	}
	byID := make(map[string]Member, len(members))
	for _, m := range members {
		byID[m.ID] = m
	}
	sorted := make([]Member, 0, len(members))
	for _, n := range r.Nodes() {
		sorted = append(sorted, byID[n.ID])
	}
	return &View{Members: sorted, Ring: r, Epoch: epoch}, nil
}

// Owner returns the member owning an object whose id has high half hi.
func (v *View) Owner(hi uint64) (Member, bool) {
	i, _ := v.Ring.Owner(hi)
	if i < 0 {
		return Member{}, false
	}
	return v.Members[i], true
}

// Owners returns up to n distinct members for an object whose id has high half hi: its
// owner first, then the next distinct owners clockwise on the ring. They are where a hot
// object's read replicas live (docs/ARCHITECTURE.md "Hot objects"); every client and the
// primary compute the same list from the same view.
func (v *View) Owners(hi uint64, n int) []Member {
	hashes, nodes := v.Ring.Points()
	if len(hashes) == 0 || n <= 0 {
		return nil
	}
	n = min(n, len(v.Members))
	i, _ := slices.BinarySearch(hashes, hi)
	out := make([]Member, 0, n)
	seen := make(map[int32]struct{}, n)
	for k := 0; k < len(hashes) && len(out) < n; k++ {
		j := nodes[(i+k)%len(hashes)]
		if _, dup := seen[j]; dup {
			continue
		}
		seen[j] = struct{}{}
		out = append(out, v.Members[j])
	}
	return out
}

// Membership supplies the current view. Implementations swap views atomically; the static
// source never changes, the MDS source follows the cluster.
type Membership interface {
	View() *View
	Close() error
}

// Static is a fixed membership.
type Static struct{ v atomic.Pointer[View] }

// NewStatic returns a fixed membership over members.
func NewStatic(members []Member, opts ...ring.Option) (*Static, error) {
	v, err := NewView(members, 1, opts...)
	if err != nil {
		return nil, err
	}
	s := &Static{}
	s.v.Store(v)
	return s, nil
}

func (s *Static) View() *View  { return s.v.Load() }
func (s *Static) Close() error { return nil }

// ParseMembers parses "id=host:port[@weight],...". A bare "host:port" gets its address as id.
func ParseMembers(s string) ([]Member, error) {
	var out []Member
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		m := Member{Weight: 1}
		if at := strings.LastIndexByte(f, '@'); at >= 0 {
			w, err := strconv.ParseUint(f[at+1:], 10, 32)
			if err != nil || w == 0 || w > ring.MaxWeight {
				return nil, fmt.Errorf("dfkv: member %q: bad weight", f)
			}
			m.Weight = uint32(w)
			f = f[:at]
		}
		if eq := strings.IndexByte(f, '='); eq >= 0 {
			m.ID, m.Addr = f[:eq], f[eq+1:]
		} else {
			m.ID, m.Addr = f, f
		}
		if m.ID == "" {
			return nil, fmt.Errorf("dfkv: member %q: empty id", f)
		}
		if _, _, err := net.SplitHostPort(m.Addr); err != nil {
			return nil, fmt.Errorf("dfkv: member %q: %w", f, err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dfkv: no members in %q", s)
	}
	return out, nil
}
