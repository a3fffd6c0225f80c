package railset

import "time"

// Defaults of Options.RefusalBackoff / RefusalBackoffMax.
const (
	defaultRefusalBackoff    = time.Second
	defaultRefusalBackoffMax = time.Minute
)

// refusalBackoff keeps a server on TCP after it refused RDMA (a server without RDMA, a
// refused or failed handshake, an RTR that failed): the first refusal holds it off for the
// base, each further one doubles that up to the bound, and a successful bootstrap resets
// it. Without it every op paid a failed handshake (docs/RDMA.md §8). Guarded by Peer.mu.
type refusalBackoff struct {
	until time.Time     // on TCP until then
	last  time.Duration // the last hold-off (0: no refusal since the last success)
	n     int           // refusals since the last success
}

// active reports whether the server is held on TCP at now.
func (b *refusalBackoff) active(now time.Time) bool { return now.Before(b.until) }

// fail records a refusal at now and returns how long the server stays on TCP.
func (b *refusalBackoff) fail(now time.Time, base, bound time.Duration) time.Duration {
	if base <= 0 {
		base = defaultRefusalBackoff
	}
	if bound < base {
		bound = max(base, defaultRefusalBackoffMax)
	}
	d := base
	if b.last > 0 {
		d = min(2*b.last, bound)
	}
	b.last, b.until = d, now.Add(d)
	b.n++
	return d
}

// ok records a successful bootstrap: the next refusal starts from the base again.
func (b *refusalBackoff) ok() { *b = refusalBackoff{} }
