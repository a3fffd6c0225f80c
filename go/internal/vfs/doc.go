//go:build linux

// Package vfs is the file-system seam under the disk engines (store/slab, store/file):
// every open, read, write, sync, allocation and directory change they make goes through an
// FS, so that tests can put an error-injecting FS (NewInjector, modelled on pebble's
// errorfs) between the engine and the disk and check that each fault fails closed.
//
// Default is the operating system's file system (Linux: O_DIRECT opens, fallocate, hole
// punching, flock). It also is the one home of the directory sync and lock helpers both
// engines need (SyncDir, Lock); the O_DIRECT alignment lives with the engine contract
// (store.BlockSize, store.AlignUp).
package vfs
