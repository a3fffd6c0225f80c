package mds

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"
)

// Sentinel errors of a Store.
var (
	// ErrNotFound: the key (or the lease bound to it) does not exist.
	ErrNotFound = errors.New("mds: not found")
	// ErrBackend wraps every other store failure (etcd unreachable, timeout).
	ErrBackend = errors.New("mds: etcd unavailable")
)

// KV is one stored key and its value.
type KV struct {
	Key   string
	Value []byte
}

// Store is the MDS's view of etcd. Every method must honour ctx's deadline.
type Store interface {
	// Put writes key=value bound to a lease of ttl. When the key already holds a live
	// lease, that lease is renewed and reused (registration is idempotent).
	Put(ctx context.Context, key string, value []byte, ttl time.Duration) error
	// KeepAlive renews the lease bound to key; a non-nil value that differs from the stored
	// one is written under the same lease. ErrNotFound when the key or its lease is gone.
	KeepAlive(ctx context.Context, key string, value []byte) error
	// Delete removes key and revokes its lease; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List returns up to limit keys under prefix, sorted by key.
	List(ctx context.Context, prefix string, limit int) ([]KV, error)
	// Ping checks that the store answers a linearizable read.
	Ping(ctx context.Context) error
	Close() error
}

// Watcher is a Store that can report changes as they happen (EtcdStore, MemStore). The
// MDS uses it to answer long polls the moment a group's membership changes; a Store
// without it serves long polls as plain polls.
type Watcher interface {
	// ListRev is List plus the store revision the listing reflects.
	ListRev(ctx context.Context, prefix string, limit int) ([]KV, int64, error)
	// Watch signals on the returned channel (capacity 1: signals coalesce) after every
	// change under prefix from revision rev on. The channel closes when the watch ends
	// (ctx done, the store lost its quorum, history compacted, an error): the caller lists
	// again and watches from there. Lease renewals are not changes; lease expiry is.
	Watch(ctx context.Context, prefix string, rev int64) <-chan struct{}
}

// MemStore is an in-memory Store with lease expiry, for tests. Now is injectable. Expired
// leases are swept on every call (and so reported to watchers then).
type MemStore struct {
	mu   sync.Mutex
	data map[string]memEntry
	Now  func() time.Time
	// Down makes every call fail with ErrBackend (an etcd outage).
	down     bool
	rev      int64
	watchers map[chan struct{}]memWatch
}

type memWatch struct {
	prefix string
	ctx    context.Context
}

type memEntry struct {
	value   []byte
	ttl     time.Duration
	expires time.Time
}

// NewMemStore returns an empty MemStore on the wall clock.
func NewMemStore() *MemStore { return &MemStore{data: map[string]memEntry{}, Now: time.Now} }

// SetDown simulates an outage (true) or recovery (false).
func (m *MemStore) SetDown(down bool) {
	m.mu.Lock()
	m.down = down
	if down {
		// An outage ends every watch, as a lost etcd quorum does (WithRequireLeader).
		for ch := range m.watchers {
			close(ch)
			delete(m.watchers, ch)
		}
	}
	m.mu.Unlock()
}

// changed bumps the revision and signals the watchers of key. Callers hold m.mu.
func (m *MemStore) changed(key string) {
	m.rev++
	for ch, w := range m.watchers {
		if w.ctx.Err() != nil {
			close(ch)
			delete(m.watchers, ch)
			continue
		}
		if strings.HasPrefix(key, w.prefix) {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// ListRev implements Watcher.
func (m *MemStore) ListRev(ctx context.Context, prefix string, limit int) ([]KV, int64, error) {
	kvs, err := m.List(ctx, prefix, limit)
	m.mu.Lock()
	defer m.mu.Unlock()
	return kvs, m.rev, err
}

// Watch implements Watcher. A rev older than the current one signals at once (the fake
// keeps no history: it cannot tell whether the prefix changed since).
func (m *MemStore) Watch(ctx context.Context, prefix string, rev int64) <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down || ctx.Err() != nil {
		close(ch)
		return ch
	}
	if m.watchers == nil {
		m.watchers = map[chan struct{}]memWatch{}
	}
	m.watchers[ch] = memWatch{prefix: prefix, ctx: ctx}
	if rev <= m.rev {
		ch <- struct{}{}
	}
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.watchers[ch]; ok {
			close(ch)
			delete(m.watchers, ch)
		}
	})
	return ch
}

func (m *MemStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(ErrBackend, err)
	}
	if m.down {
		return ErrBackend
	}
	now := m.Now()
	for k, e := range m.data {
		if !now.Before(e.expires) {
			delete(m.data, k)
			m.changed(k)
		}
	}
	return nil
}

func (m *MemStore) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return err
	}
	m.data[key] = memEntry{value: bytes.Clone(value), ttl: ttl, expires: m.Now().Add(ttl)}
	m.changed(key)
	return nil
}

func (m *MemStore) KeepAlive(ctx context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return err
	}
	e, ok := m.data[key]
	if !ok {
		return ErrNotFound
	}
	e.expires = m.Now().Add(e.ttl)
	valueChanged := value != nil && !bytes.Equal(value, e.value)
	if valueChanged {
		e.value = bytes.Clone(value)
	}
	m.data[key] = e
	if valueChanged {
		m.changed(key)
	}
	return nil
}

func (m *MemStore) Delete(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return err
	}
	if _, ok := m.data[key]; ok {
		delete(m.data, key)
		m.changed(key)
	}
	return nil
}

func (m *MemStore) List(ctx context.Context, prefix string, limit int) ([]KV, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	var out []KV
	for k, e := range m.data {
		if strings.HasPrefix(k, prefix) {
			out = append(out, KV{Key: k, Value: bytes.Clone(e.value)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (m *MemStore) Ping(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.check(ctx)
}

func (m *MemStore) Close() error { return nil }
