//go:build linux

// Package file is the diagnostic storage engine: one file per value, for comparison and
// rollback, never the production default (that is package slab).
//
// Layout: dir/objects/ab/cd/<32-hex object id>-<16-hex tenant>, where ab and cd are the
// first two bytes of the id. Each file is a 48-byte header (magic, length, CRC32C of the
// value, key, header CRC) followed by the raw value. Writes go to dir/tmp, are fsynced and
// renamed into place (then the directory is fsynced), so a crash leaves the old value,
// the new one, or nothing. The index is rebuilt by walking dir/objects at Open. Capacity
// is enforced by evicting the oldest values first.
package file
