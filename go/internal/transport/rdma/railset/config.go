package railset

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
)

// defaultRailQuarantine bounds how long a rail that failed towards a peer is avoided.
const defaultRailQuarantine = 10 * time.Second

// railConfig is the client's rail policy (Options.Devices / Primary / Tiers).
type railConfig struct {
	devices []string       // the whitelist in order; empty: one device, today's behaviour
	tier    map[string]int // the client's tier of each device (all 0 without Tiers)
	tiered  bool           // Tiers were configured: members without rails fail closed
	primary string
	// slowFactor demotes a rail slower than this times its tier's best (0: off); latency.go.
	slowFactor float64
}

// newRailConfig validates the options: every tiered device must be whitelisted and the
// whitelist must be covered by the tiers; the primary must be whitelisted.
func newRailConfig(o *Options, invalid error) (railConfig, error) {
	rc := railConfig{devices: slices.Clone(o.Devices), tier: map[string]int{}, primary: o.Primary}
	f, err := railSlowFactor(o, invalid)
	if err != nil {
		return rc, err
	}
	rc.slowFactor = f
	seen := map[string]bool{}
	for _, d := range rc.devices {
		if d == "" || seen[d] {
			return rc, fmt.Errorf("dfkv: rdma devices %q: empty or repeated name: %w", o.Devices, invalid)
		}
		seen[d] = true
		rc.tier[d] = 0
	}
	if len(o.Tiers) > 0 {
		if len(rc.devices) == 0 {
			return rc, fmt.Errorf("dfkv: rdma tiers need a device list: %w", invalid)
		}
		rc.tiered = true
		placed := map[string]bool{}
		for t, ds := range o.Tiers {
			if len(ds) == 0 {
				return rc, fmt.Errorf("dfkv: rdma tier %d is empty: %w", t, invalid)
			}
			for _, d := range ds {
				if !seen[d] || placed[d] {
					return rc, fmt.Errorf("dfkv: rdma tiers: device %q not in the device list or placed twice: %w", d, invalid)
				}
				placed[d] = true
				rc.tier[d] = t
			}
		}
		if len(placed) != len(seen) {
			return rc, fmt.Errorf("dfkv: rdma tiers leave a listed device out: %w", invalid)
		}
	}
	if rc.primary != "" && len(rc.devices) > 0 && !seen[rc.primary] {
		return rc, fmt.Errorf("dfkv: rdma primary %q is not in the device list: %w", rc.primary, invalid)
	}
	return rc, nil
}

// candidates returns the rails to use towards a member, in preference order: the usable
// ones of the highest tier that has any (the primary first, else list order). usable says
// whether the client itself may use a rail towards this peer now (not quarantined).
//
//   - No whitelist: nil, nil (one device, chosen as before rails).
//   - Rails not published (a static membership, or a member without rails): the whitelist
//     when the client has no tiers; with tiers, fail closed (ErrNoCompatibleRail).
//   - Published: whitelist ∩ published Healthy ∩ usable; the tier is the client's when
//     it has tiers, else the member's. None: ErrNoCompatibleRail.
func (rc *railConfig) candidates(published []wire.Rail, usable func(string) bool) ([]string, error) {
	if len(rc.devices) == 0 {
		return nil, nil
	}
	tierOf := map[string]int{}
	if len(published) == 0 {
		if rc.tiered {
			return nil, fmt.Errorf("rdma tiers configured but the server publishes no rails: %w", ErrNoCompatibleRail)
		}
		for _, d := range rc.devices {
			tierOf[d] = 0
		}
	} else {
		for _, r := range published {
			if _, ok := rc.tier[r.Device]; ok && r.Usable() {
				if rc.tiered {
					tierOf[r.Device] = rc.tier[r.Device]
				} else {
					tierOf[r.Device] = int(r.Tier)
				}
			}
		}
	}
	best := -1
	for _, d := range rc.devices {
		if t, ok := tierOf[d]; ok && usable(d) && (best < 0 || t < best) {
			best = t
		}
	}
	if best < 0 {
		if len(published) == 0 {
			return nil, fmt.Errorf("every rail of %q is quarantined: %w", rc.devices, ErrNoCompatibleRail)
		}
		return nil, fmt.Errorf("the server publishes no healthy rail of %q: %w", rc.devices, ErrNoCompatibleRail)
	}
	var out []string
	for _, d := range rc.devices {
		if t, ok := tierOf[d]; ok && t == best && usable(d) {
			if d == rc.primary {
				out = append([]string{d}, out...)
			} else {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// railSlowFactor resolves Options.RailSlowFactor: 0 = default, < 0 = off (0 returned).
func railSlowFactor(o *Options, invalid error) (float64, error) {
	f := o.RailSlowFactor
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0) || (f > 0 && f < 1):
		return 0, fmt.Errorf("dfkv: rdma rail slow factor %v: want >= 1, 0 (default %v) or < 0 (off): %w", f, defaultRailSlowFactor, invalid)
	case f == 0:
		return defaultRailSlowFactor, nil
	case f < 0:
		return 0, nil
	}
	return f, nil
}
