//go:build linux

package slab

import (
	"sync"

	"golang.org/x/sys/unix"
)

// bufPool hands out 4096-aligned buffers allocated with anonymous mmap: page-aligned for
// O_DIRECT, invisible to the GC, and pre-faulted (touching fresh memory is slow on the
// VMs we run on). Buffers are kept per size (one size per slab class) up to maxIdle idle
// bytes in total; beyond that they are unmapped.
type bufPool struct {
	mu      sync.Mutex
	free    map[int64][][]byte
	idle    int64
	maxIdle int64
	closed  bool
}

func newBufPool(maxIdle int64) *bufPool {
	return &bufPool{free: make(map[int64][][]byte), maxIdle: maxIdle}
}

// get returns a buffer of exactly size bytes (size is a multiple of 4096).
func (p *bufPool) get(size int64) ([]byte, error) {
	p.mu.Lock()
	if l := p.free[size]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[size] = l[:len(l)-1]
		p.idle -= size
		p.mu.Unlock()
		return b, nil
	}
	p.mu.Unlock()
	return unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
}

func (p *bufPool) put(b []byte) {
	size := int64(cap(b))
	b = b[:size]
	p.mu.Lock()
	if !p.closed && p.idle+size <= p.maxIdle {
		p.free[size] = append(p.free[size], b)
		p.idle += size
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	_ = unix.Munmap(b)
}

// close unmaps the idle buffers; buffers still checked out are unmapped on return.
func (p *bufPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for size, l := range p.free {
		for _, b := range l {
			_ = unix.Munmap(b)
		}
		delete(p.free, size)
	}
	p.idle = 0
}
