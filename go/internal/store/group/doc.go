//go:build linux

// Package group presents the engines of several disks (one per --dir) as one
// store.Engine. Each key is routed by an intra-node Ketama ring over the disks, hashed by
// the LOW 64 bits of the object id (the node ring already consumed the high bits, so
// reusing them would send all of a node's keys to a few disks). Disk ids are
// "disk0".."diskN-1" in --dir order.
package group
