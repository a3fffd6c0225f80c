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

// MemStore is an in-memory Store with lease expiry, for tests. Now is injectable.
type MemStore struct {
	mu   sync.Mutex
	data map[string]memEntry
	Now  func() time.Time
	// Down makes every call fail with ErrBackend (an etcd outage).
	down bool
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
	m.mu.Unlock()
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
	if value != nil {
		e.value = bytes.Clone(value)
	}
	m.data[key] = e
	return nil
}

func (m *MemStore) Delete(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(ctx); err != nil {
		return err
	}
	delete(m.data, key)
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
