// Package quota enforces per-tenant byte quotas on a store.Engine.
//
// Bytes are charged per tenant hash (store.Key.Tenant) when a PUT succeeds and released
// whenever the value leaves the engine: overwrite, remove, eviction or a failed
// verification, as reported by the engine's store.RemovalObserver. Usage is rebuilt from
// the engine's contents (store.Lister) at start, so it survives restarts and never drifts.
// A PUT that would take a tenant over its limit fails with store.ErrQuotaExceeded before
// any byte is read (the server answers QuotaExceeded).
//
// Quota file format: one tenant per line, "#" starts a comment, blank lines are ignored.
//
//	# tenant            bytes (plain or with KiB/MiB/GiB/TiB, K/M/G/T = powers of 1024)
//	team-a              10GiB
//	0x8c1f3e2a9b4d5e60  512MiB
//	default             1GiB
//
// The first field is the tenant name as clients send it (hashed with identity.Tenant), or
// the tenant hash itself as 16 hexadecimal digits with a 0x prefix. The name "default"
// sets the limit of tenants not listed (overriding --default-quota). A limit of 0 means
// unlimited. Only listed tenants get their own metric label; the others are summed as
// "other", which keeps metric cardinality bounded.
package quota

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

// Limits are the configured quotas.
type Limits struct {
	Default int64            // bytes for tenants not listed; 0 = unlimited
	Tenants map[uint64]Entry // by tenant hash
}

// Entry is one listed tenant.
type Entry struct {
	Label string // as written in the file
	Bytes int64  // 0 = unlimited
}

// ParseFile reads a quota file (see the package documentation).
func ParseFile(path string) (Limits, error) {
	f, err := os.Open(path)
	if err != nil {
		return Limits{}, fmt.Errorf("quota: %w", err)
	}
	defer f.Close()
	l, err := Parse(f)
	if err != nil {
		return Limits{}, fmt.Errorf("quota: %s: %w", path, err)
	}
	return l, nil
}

// Parse reads quota lines from r. Default is -1 when the file has no "default" line.
func Parse(r io.Reader) (Limits, error) {
	l := Limits{Default: -1, Tenants: map[uint64]Entry{}}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return Limits{}, fmt.Errorf("line %d: want \"tenant bytes\", got %q", line, strings.TrimSpace(text))
		}
		n, err := ParseSize(fields[1])
		if err != nil {
			return Limits{}, fmt.Errorf("line %d: %w", line, err)
		}
		if fields[0] == "default" {
			l.Default = n
			continue
		}
		if fields[0] == "other" {
			return Limits{}, fmt.Errorf("line %d: \"other\" is reserved (the metric label of unlisted tenants)", line)
		}
		h := TenantHash(fields[0])
		if _, dup := l.Tenants[h]; dup {
			return Limits{}, fmt.Errorf("line %d: tenant %q listed twice", line, fields[0])
		}
		l.Tenants[h] = Entry{Label: fields[0], Bytes: n}
	}
	if err := sc.Err(); err != nil {
		return Limits{}, err
	}
	return l, nil
}

// TenantHash returns the hash a quota-file tenant field names: "0x" and 16 hex digits is
// the hash itself, anything else is a tenant name hashed with identity.Tenant.
func TenantHash(field string) uint64 {
	if len(field) == 18 && (strings.HasPrefix(field, "0x") || strings.HasPrefix(field, "0X")) {
		if h, err := strconv.ParseUint(field[2:], 16, 64); err == nil {
			return h
		}
	}
	return identity.Tenant([]byte(field))
}

// ParseSize parses a byte count: "1048576", "512MiB", "10G".
func ParseSize(v string) (int64, error) {
	units := []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(v, u.s) {
			v, mult = strings.TrimSuffix(v, u.s), u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad byte count %q", v)
	}
	return n * mult, nil
}

type tenant struct {
	used     atomic.Int64
	rejected atomic.Int64
	limit    int64
	label    string // "" = aggregated as "other"
}

// Engine enforces quotas on the engine it wraps.
type Engine struct {
	store.Engine
	def int64

	mu      sync.RWMutex
	tenants map[uint64]*tenant
	listed  []*tenant // in label order, for metrics
}

var (
	_ store.Engine        = (*Engine)(nil)
	_ store.QuotaReporter = (*Engine)(nil)
)

// Wrap enforces l on e: it becomes the removal observer of e's chain and charges e's
// current contents.
func Wrap(e store.Engine, l Limits) (*Engine, error) {
	if _, ok := store.Find[store.Observable](e); !ok {
		return nil, errors.New("quota: the storage engine does not report removals, so usage would drift")
	}
	q := &Engine{Engine: e, def: max(l.Default, 0), tenants: map[uint64]*tenant{}}
	for h, ent := range l.Tenants {
		t := &tenant{limit: ent.Bytes, label: ent.Label}
		q.tenants[h] = t
		q.listed = append(q.listed, t)
	}
	sort.Slice(q.listed, func(i, j int) bool { return q.listed[i].label < q.listed[j].label })
	store.SetRemovalObserver(e, q.removed)
	if lister, ok := store.Find[store.Lister](e); ok {
		lister.ForEach(func(k store.Key, n int64) bool {
			q.tenant(k.Tenant).used.Add(n)
			return true
		})
	}
	return q, nil
}

// Unwrap returns the wrapped engine.
func (q *Engine) Unwrap() store.Engine { return q.Engine }

func (q *Engine) tenant(h uint64) *tenant {
	q.mu.RLock()
	t := q.tenants[h]
	q.mu.RUnlock()
	if t != nil {
		return t
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if t = q.tenants[h]; t == nil {
		t = &tenant{limit: q.def}
		q.tenants[h] = t
	}
	return t
}

func (q *Engine) removed(k store.Key, size int64, _ store.RemovalReason) {
	q.tenant(k.Tenant).used.Add(-size)
}

// Put refuses a value that would take its tenant over quota (counting an overwritten
// value as released), and charges it once stored.
func (q *Engine) Put(key store.Key, size int, fill func([]byte) error) error {
	t := q.tenant(key.Tenant)
	if t.limit > 0 {
		var old int64
		if n, err := q.Engine.Stat(key); err == nil {
			old = n
		}
		if t.used.Load()-old+int64(size) > t.limit {
			t.rejected.Add(1)
			return fmt.Errorf("quota: tenant %016x: %d bytes used, %d more over its %d-byte limit: %w",
				key.Tenant, t.used.Load(), size, t.limit, store.ErrQuotaExceeded)
		}
	}
	if err := q.Engine.Put(key, size, fill); err != nil {
		return err
	}
	t.used.Add(int64(size))
	return nil
}

// Used returns the bytes charged to a tenant hash.
func (q *Engine) Used(tenantHash uint64) int64 { return q.tenant(tenantHash).used.Load() }

// TenantUsage implements store.QuotaReporter: listed tenants by label, the rest as "other".
func (q *Engine) TenantUsage() []store.TenantUsage {
	q.mu.RLock()
	defer q.mu.RUnlock()
	out := make([]store.TenantUsage, 0, len(q.listed)+1)
	for _, t := range q.listed {
		out = append(out, store.TenantUsage{Tenant: t.label, UsedBytes: t.used.Load(), LimitBytes: t.limit, Rejected: t.rejected.Load()})
	}
	other := store.TenantUsage{Tenant: "other", LimitBytes: q.def}
	for _, t := range q.tenants {
		if t.label == "" {
			other.UsedBytes += t.used.Load()
			other.Rejected += t.rejected.Load()
		}
	}
	return append(out, other)
}
