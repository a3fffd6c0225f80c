//go:build linux

package group

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/file"
	"github.com/dfkv/dfkv/go/internal/store/slab"
	"github.com/dfkv/dfkv/go/ring"
)

var (
	_ store.Engine       = (*Group)(nil)
	_ store.DirectReader = (*Group)(nil)
	_ store.Toucher      = (*Group)(nil)
	_ store.DirectWriter = (*Group)(nil)
	_ store.BatchWriter  = (*Group)(nil)
	_ store.Observable   = (*Group)(nil)
	_ store.Lister       = (*Group)(nil)
)

// Group routes each key to one member engine. It is safe for concurrent use.
type Group struct {
	members []store.Engine
	ring    *ring.Ring
	byPoint []int // ring node index -> member index
}

// DiskID names member i on the intra-node ring.
func DiskID(i int) string { return "disk" + strconv.Itoa(i) }

// New groups engines, in --dir order. The group owns them: Close closes them all.
func New(members []store.Engine) (*Group, error) {
	if len(members) == 0 {
		return nil, errors.New("group: no engines")
	}
	nodes := make([]ring.Node, len(members))
	for i := range members {
		if members[i] == nil {
			return nil, fmt.Errorf("group: engine %d is nil", i)
		}
		nodes[i] = ring.Node{ID: DiskID(i), Weight: 1}
	}
	// The disk ring keeps the first releases' density: which disk holds a key is on disk.
	r, err := ring.New(nodes, ring.WithPointsPerWeight(ring.LegacyPointsPerWeight))
	if err != nil {
		return nil, fmt.Errorf("group: %w", err)
	}
	g := &Group{members: slices.Clone(members), ring: r}
	// Ring nodes are sorted by id ("disk10" < "disk2"), so map them back to --dir order.
	for _, n := range r.Nodes() {
		i, _ := strconv.Atoi(strings.TrimPrefix(n.ID, "disk"))
		g.byPoint = append(g.byPoint, i)
	}
	return g, nil
}

// Route returns the index (in --dir order) of the disk that owns key.
func (g *Group) Route(key store.Key) int {
	i, _ := g.ring.Owner(key.ID.Lo)
	return g.byPoint[i]
}

// Members returns the member engines in --dir order (for per-disk stats).
func (g *Group) Members() []store.Engine { return slices.Clone(g.members) }

func (g *Group) Put(key store.Key, size int, fill func(dst []byte) error) error {
	return g.members[g.Route(key)].Put(key, size, fill)
}

func (g *Group) Get(key store.Key, fn func(value []byte) error) error {
	return g.members[g.Route(key)].Get(key, fn)
}

// ReadInto reads through the owning disk's DirectReader (Get and a copy for engines
// without one).
func (g *Group) ReadInto(key store.Key, dst []byte) (int, error) {
	return store.ReadInto(g.members[g.Route(key)], key, dst)
}

// PutFrom writes through the owning disk's DirectWriter (Put and a copy without one).
func (g *Group) PutFrom(key store.Key, src []byte, size int) error {
	return store.PutFrom(g.members[g.Route(key)], key, src, size)
}

// PutFromBatch splits the batch by owning disk and writes each part through that disk's
// BatchWriter (one by one without one), the disks in parallel.
func (g *Group) PutFromBatch(items []store.DirectItem, errs []error) {
	parts := make(map[int][]int, len(g.members))
	for i, it := range items {
		m := g.Route(it.Key)
		parts[m] = append(parts[m], i)
	}
	var wg sync.WaitGroup
	for m, idx := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := make([]store.DirectItem, len(idx))
			subErrs := make([]error, len(idx))
			for j, i := range idx {
				sub[j] = items[i]
			}
			store.PutFromBatch(g.members[m], sub, subErrs)
			for j, i := range idx {
				errs[i] = subErrs[j]
			}
		}()
	}
	wg.Wait()
}

// Touch records a use of key on the owning disk (see store.Toucher).
func (g *Group) Touch(key store.Key) { store.Touch(g.members[g.Route(key)], key) }

// SetRemovalObserver installs fn on every member that reports removals.
func (g *Group) SetRemovalObserver(fn store.RemovalObserver) {
	for _, m := range g.members {
		store.SetRemovalObserver(m, fn)
	}
}

// ForEach visits the values of every member that can list them.
func (g *Group) ForEach(fn func(store.Key, int64) bool) {
	for _, m := range g.members {
		l, ok := m.(store.Lister)
		if !ok {
			continue
		}
		more := true
		l.ForEach(func(k store.Key, n int64) bool {
			more = fn(k, n)
			return more
		})
		if !more {
			return
		}
	}
}

func (g *Group) Stat(key store.Key) (int64, error) { return g.members[g.Route(key)].Stat(key) }

// Has asks the owning disk (see store.Haser): a slab answers a miss without building an
// error, which a Stat miss would on every write-back PUT of a new key.
func (g *Group) Has(key store.Key) (bool, error) { return store.Has(g.members[g.Route(key)], key) }

func (g *Group) Remove(key store.Key) error { return g.members[g.Route(key)].Remove(key) }

// Stats sums the members. Engine is the members' engine name; Healthy requires every
// member to be healthy (a failed disk makes its share of keys unavailable).
func (g *Group) Stats() store.Stats {
	var s store.Stats
	s.Healthy = true
	for i, m := range g.members {
		ms := m.Stats()
		s.Add(ms)
		s.Healthy = s.Healthy && ms.Healthy
		if i == 0 {
			s.Engine = ms.Engine
		} else if s.Engine != ms.Engine {
			s.Engine = "mixed"
		}
	}
	return s
}

// Close closes every member and joins their errors.
func (g *Group) Close() error {
	var errs []error
	for i, m := range g.members {
		if err := m.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", DiskID(i), err))
		}
	}
	return errors.Join(errs...)
}

// Options configure OpenDirs.
type Options struct {
	// Engine is "slab" (default) or "file".
	Engine string
	// Dirs are the disk directories, in --dir order.
	Dirs []string
	// CapacityBytes is the node's total capacity, split evenly over the disks.
	CapacityBytes int64
	// Slab and File are templates for each disk; Dir, CapacityBytes and Logger are set
	// per disk.
	Slab   slab.Config
	File   file.Config
	Logger *slog.Logger
}

// OpenDirs opens one engine per directory with a capacity share of CapacityBytes/len(Dirs)
// and groups them. If any disk fails to open, the ones already open are closed and the
// error names the disk.
func OpenDirs(o Options) (*Group, error) {
	if len(o.Dirs) == 0 {
		return nil, errors.New("group: no directories")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	seen := map[string]bool{}
	for _, d := range o.Dirs {
		if d == "" {
			return nil, errors.New("group: empty directory in the list")
		}
		if seen[d] {
			return nil, fmt.Errorf("group: directory %q listed twice", d)
		}
		seen[d] = true
	}
	share := o.CapacityBytes / int64(len(o.Dirs))
	members := make([]store.Engine, 0, len(o.Dirs))
	fail := func(i int, err error) (*Group, error) {
		for _, m := range members {
			_ = m.Close()
		}
		return nil, fmt.Errorf("group: %s (%s): %w", DiskID(i), o.Dirs[i], err)
	}
	for i, dir := range o.Dirs {
		log := o.Logger.With("disk", DiskID(i))
		var (
			e   store.Engine
			err error
		)
		switch o.Engine {
		case "", "slab":
			c := o.Slab
			c.Dir, c.CapacityBytes, c.Logger = dir, share, log
			e, err = slab.Open(c)
		case "file":
			c := o.File
			c.Dir, c.CapacityBytes, c.Logger = dir, share, log
			e, err = file.Open(c)
		default:
			return nil, fmt.Errorf("group: unknown engine %q (want slab or file)", o.Engine)
		}
		if err != nil {
			return fail(i, err)
		}
		members = append(members, e)
	}
	return New(members)
}

// Lease leases key on its owning disk (a lookup without a lease where that disk's engine
// has none).
func (g *Group) Lease(key store.Key, ttl time.Duration) (int64, bool, error) {
	return store.Lease(g.members[g.Route(key)], key, ttl)
}

// ReleaseLease ends key's lease on its owning disk.
func (g *Group) ReleaseLease(key store.Key) {
	if l, ok := store.Find[store.Leaser](g.members[g.Route(key)]); ok {
		l.ReleaseLease(key)
	}
}

// LeaseStats sums the members' lease tables.
func (g *Group) LeaseStats() store.LeaseStats {
	var s store.LeaseStats
	for _, m := range g.members {
		if l, ok := store.Find[store.Leaser](m); ok {
			s.Add(l.LeaseStats())
		}
	}
	return s
}
