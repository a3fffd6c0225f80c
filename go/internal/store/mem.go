package store

import (
	"fmt"
	"sync"
)

// Mem is an in-memory Engine with byte-capacity LRU-free eviction (oldest insert first).
// It exists for unit tests of the layers above the storage engines.
type Mem struct {
	mu       sync.Mutex
	capacity int64
	used     int64
	values   map[Key][]byte
	order    []Key // insertion order for eviction; may hold stale keys
	stats    Stats
	closed   bool
	observer RemovalObserver
}

var (
	_ Observable = (*Mem)(nil)
	_ Lister     = (*Mem)(nil)
)

// SetRemovalObserver implements Observable.
func (m *Mem) SetRemovalObserver(fn RemovalObserver) {
	m.mu.Lock()
	m.observer = fn
	m.mu.Unlock()
}

func (m *Mem) notifyLocked(k Key, size int, why RemovalReason) {
	if m.observer != nil {
		m.observer(k, int64(size), why)
	}
}

// ForEach implements Lister.
func (m *Mem) ForEach(fn func(Key, int64) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.values {
		if !fn(k, int64(len(v))) {
			return
		}
	}
}

// NewMem returns an empty in-memory engine holding at most capacity bytes (0 = unbounded).
func NewMem(capacity int64) *Mem {
	return &Mem{capacity: capacity, values: make(map[Key][]byte)}
}

func (m *Mem) Put(key Key, size int, fill func([]byte) error) error {
	if size <= 0 {
		return fmt.Errorf("mem: put size %d: %w", size, ErrInvalid)
	}
	if m.capacity > 0 && int64(size) > m.capacity {
		return fmt.Errorf("mem: put %d bytes: %w", size, ErrTooLarge)
	}
	buf := make([]byte, size)
	if err := fill(buf); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if old, ok := m.values[key]; ok {
		m.used -= int64(len(old))
		m.notifyLocked(key, len(old), Replaced)
	} else {
		m.order = append(m.order, key)
	}
	for m.capacity > 0 && m.used+int64(size) > m.capacity && len(m.order) > 0 {
		victim := m.order[0]
		m.order = m.order[1:]
		if v, ok := m.values[victim]; ok && victim != key {
			delete(m.values, victim)
			m.used -= int64(len(v))
			m.stats.Evictions++
			m.stats.EvictedBytes += int64(len(v))
			m.notifyLocked(victim, len(v), Evicted)
		}
	}
	m.values[key] = buf
	m.used += int64(size)
	m.stats.Writes++
	m.stats.WriteBytes += int64(size)
	return nil
}

func (m *Mem) Get(key Key, fn func([]byte) error) error {
	m.mu.Lock()
	v, ok := m.values[key]
	closed := m.closed
	if ok {
		m.stats.Reads++
		m.stats.ReadBytes += int64(len(v))
	}
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if !ok {
		return ErrNotFound
	}
	// Values are never mutated in place (Put replaces the slice), so no lock is needed here.
	return fn(v)
}

func (m *Mem) Stat(key Key) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.values[key]
	if !ok {
		return 0, ErrNotFound
	}
	return int64(len(v)), nil
}

func (m *Mem) Remove(key Key) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.values[key]
	if !ok {
		return ErrNotFound
	}
	delete(m.values, key)
	m.used -= int64(len(v))
	m.notifyLocked(key, len(v), Removed)
	return nil
}

func (m *Mem) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Engine = "mem"
	s.Objects = int64(len(m.values))
	s.UsedBytes = m.used
	s.CapacityBytes = m.capacity
	s.Healthy = !m.closed
	return s
}

func (m *Mem) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}
