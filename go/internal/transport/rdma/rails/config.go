package rails

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrConfig marks a rail configuration the server refuses to start with.
var ErrConfig = errors.New("rails: bad configuration")

// Spec is one configured rail.
type Spec struct {
	Device string
	Tier   uint8
}

// ParseList splits a comma-separated device list (--rdma-dev), refusing duplicates.
func ParseList(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		if err := validName(d); err != nil {
			return nil, err
		}
		if seen[d] {
			return nil, fmt.Errorf("%w: device %q listed twice", ErrConfig, d)
		}
		seen[d] = true
		out = append(out, d)
	}
	return out, nil
}

func validName(d string) error {
	if len(d) > 64 {
		return fmt.Errorf("%w: device name %.16q… longer than 64 bytes", ErrConfig, d)
	}
	for i := 0; i < len(d); i++ {
		if c := d[i]; c <= ' ' || c >= 0x7f || c == ';' || c == '|' || c == ',' {
			return fmt.Errorf("%w: device name %q: printable ASCII without separators only", ErrConfig, d)
		}
	}
	return nil
}

// ParseTiers parses --rdma-tiers: tiers separated by ';', leftmost = tier 0, devices in a
// tier separated by ',' (or '|', the seed's spelling), e.g. "mlx5_0,mlx5_1;mlx5_2". Every
// device must be one of devs (the --rdma-dev list, which must then be explicit), appear
// once, and every one of devs must be in some tier: a rail without a tier would be a silent
// choice. An empty spec puts every device in tier 0.
func ParseTiers(spec string, devs []string) (map[string]uint8, error) {
	out := make(map[string]uint8, len(devs))
	if strings.TrimSpace(spec) == "" {
		for _, d := range devs {
			out[d] = 0
		}
		return out, nil
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w: --rdma-tiers %q needs an explicit --rdma-dev list", ErrConfig, spec)
	}
	known := map[string]bool{}
	for _, d := range devs {
		known[d] = true
	}
	tiers := strings.Split(spec, ";")
	if len(tiers) > 255 {
		return nil, fmt.Errorf("%w: --rdma-tiers %q: more than 255 tiers", ErrConfig, spec)
	}
	for i, t := range tiers {
		names := strings.FieldsFunc(t, func(r rune) bool { return r == ',' || r == '|' })
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: --rdma-tiers %q: tier %d is empty", ErrConfig, spec, i)
		}
		for _, d := range names {
			d = strings.TrimSpace(d)
			if err := validName(d); err != nil {
				return nil, err
			}
			if !known[d] {
				return nil, fmt.Errorf("%w: --rdma-tiers %q: device %q is not in --rdma-dev %s", ErrConfig, spec, d, strings.Join(devs, ","))
			}
			if _, dup := out[d]; dup {
				return nil, fmt.Errorf("%w: --rdma-tiers %q: device %q in two places", ErrConfig, spec, d)
			}
			out[d] = uint8(i)
		}
	}
	var missing []string
	for _, d := range devs {
		if _, ok := out[d]; !ok {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: --rdma-tiers %q leaves out %s (every --rdma-dev device needs a tier)", ErrConfig, spec, strings.Join(missing, ","))
	}
	return out, nil
}

// Plan resolves the configured rails: devs in order with their tiers, and the primary
// (which must be one of devs when devs is explicit).
func Plan(devs []string, tierSpec, primary string) ([]Spec, error) {
	tiers, err := ParseTiers(tierSpec, devs)
	if err != nil {
		return nil, err
	}
	primary = strings.TrimSpace(primary)
	if primary != "" {
		if err := validName(primary); err != nil {
			return nil, err
		}
		if len(devs) > 0 {
			if _, ok := tiers[primary]; !ok {
				return nil, fmt.Errorf("%w: --rdma-primary-dev %q is not in --rdma-dev %s", ErrConfig, primary, strings.Join(devs, ","))
			}
		}
	}
	out := make([]Spec, 0, len(devs))
	for _, d := range devs {
		out = append(out, Spec{Device: d, Tier: tiers[d]})
	}
	return out, nil
}

// ServeOrder is the order in which the server tries to open a device to serve on: the
// primary first, then the rest of the list by tier, keeping list order within a tier.
func ServeOrder(specs []Spec, primary string) []string {
	rest := make([]Spec, 0, len(specs))
	for _, s := range specs {
		if s.Device != primary {
			rest = append(rest, s)
		}
	}
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].Tier < rest[j].Tier })
	var out []string
	if primary != "" {
		out = append(out, primary)
	}
	for _, s := range rest {
		out = append(out, s.Device)
	}
	return out
}
