package verbs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Buffer is page-aligned anonymous memory outside the Go heap, safe to register with any
// provider (cgo forbids C from keeping Go heap pointers past a call).
type Buffer struct{ b, mapping []byte }

// AllocBuffer maps n bytes (rounded up to the page size) of zeroed private memory.
func AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: buffer of %d bytes", ErrInvalid, n)
	}
	pg := unix.Getpagesize()
	sz := (n + pg - 1) / pg * pg
	b, err := unix.Mmap(-1, 0, sz, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w", sz, err)
	}
	return &Buffer{b: b[:n:n], mapping: b}, nil
}

// Bytes is the buffer's memory; valid until Free.
func (b *Buffer) Bytes() []byte { return b.b }

// Free unmaps the buffer. Deregister every MR over it first.
func (b *Buffer) Free() error {
	if b.mapping == nil {
		return nil
	}
	m := b.mapping
	b.b, b.mapping = nil, nil
	return unix.Munmap(m)
}
