// Package store defines the storage engine seam of a cache node: the Engine interface,
// the sentinel errors callers branch on, and an in-memory engine for tests of the layers
// above. Disk engines live in subpackages: slab (the default), file (diagnostic) and group
// (several disks behind one engine via an intra-node Ketama ring).
package store
