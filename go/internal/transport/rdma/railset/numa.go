package railset

import (
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// NUMA locality (DFKV_RDMA_NUMA=1; docs/RDMA.md §4). Inside the tier health chose, rails
// whose local device sits on the caller's NUMA node come first; the others of the same
// tier follow (they take the load when the local ones are out of credits). Locality never
// picks a lower tier.

// callerNUMANode is the NUMA node of the CPU this thread runs on (-1 when unknown).
func callerNUMANode() int {
	node, err := getcpuNode()
	if err != nil {
		return -1
	}
	return node
}

// railNodes maps each whitelisted device to its NUMA node (-1 unknown) from the provider.
func (s *Set) railNodes() map[string]int {
	out := map[string]int{}
	prov, err := s.provider()
	if err != nil {
		return out
	}
	infos, err := prov.Devices()
	if err != nil {
		return out
	}
	for _, in := range infos {
		out[in.Name] = in.NUMANode
	}
	return out
}

// orderRails puts cands (one tier, in list order) in preference order: the primary
// first, then the rails local to node (rotated by rr), then the others (rotated by rr).
// node < 0 (NUMA off or unknown) makes every rail "other".
func orderRails(cands []string, primary string, rr uint32, node int, nodeOf map[string]int) []string {
	var first, local, other []string
	for _, d := range cands {
		n, known := nodeOf[d]
		switch {
		case d == primary:
			first = append(first, d)
		case node >= 0 && known && n == node:
			local = append(local, d)
		default:
			other = append(other, d)
		}
	}
	rot := func(s []string) []string {
		if len(s) < 2 {
			return s
		}
		k := int(rr % uint32(len(s)))
		return append(append([]string(nil), s[k:]...), s[:k]...)
	}
	return append(append(first, rot(local)...), rot(other)...)
}

// numaView returns the caller's node (-1: NUMA off or unknown) and each device's node.
func (s *Set) numaView() (int, map[string]int) {
	x := &s.rx
	if !s.o.NUMA {
		return -1, nil
	}
	x.nodesOnce.Do(func() { x.nodeOf = s.railNodes() })
	return x.numaNode, x.nodeOf
}

// railOrder is p's usable rails of the highest usable tier in preference order (primary,
// NUMA locality, round robin; then latency demotion inside that tier).
func (p *Peer) railOrder() ([]string, error) {
	s := p.s
	rc := &s.rc
	var published []wire.Rail
	if s.o.Published != nil {
		published = s.o.Published(p.addr)
	}
	now := time.Now()
	cands, err := rc.candidates(published, func(d string) bool { return !p.quarantined(d, now) })
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	i := p.rr
	p.rr++
	p.mu.Unlock()
	node, nodeOf := s.numaView()
	return p.demoteSlowRails(orderRails(cands, rc.primary, i, node, nodeOf)), nil
}
