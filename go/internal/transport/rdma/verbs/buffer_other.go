//go:build !linux

package verbs

import "fmt"

// Buffer is memory for registration. Without Linux there is no RDMA provider to register
// it with; the Go heap serves so that the packages above the seam still build and fail at
// run time with the provider's reason.
type Buffer struct{ b []byte }

// AllocBuffer allocates n zeroed bytes.
func AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: buffer of %d bytes", ErrInvalid, n)
	}
	return &Buffer{b: make([]byte, n)}, nil
}

// Bytes is the buffer's memory; valid until Free.
func (b *Buffer) Bytes() []byte { return b.b }

// Free drops the buffer.
func (b *Buffer) Free() error {
	b.b = nil
	return nil
}
