//go:build linux

// Package directio holds the O_DIRECT file primitives shared by the slab engine and the
// benchmark's raw-disk baseline: opening a file for direct, synchronous I/O and positional
// reads and writes that retry EINTR and short transfers. Buffers passed to them must be
// 4096-aligned (e.g. from unix.Mmap), as O_DIRECT requires.
package directio
