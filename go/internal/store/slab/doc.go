//go:build linux

// Package slab is the default production storage engine of a cache node: one Engine per
// disk directory, storing values in a fixed pool of preallocated extent files carved into
// deterministic size classes.
//
// On-disk layout of one directory:
//
//	slab.meta      JSON superblock: geometry (extent size and count, max value, size
//	               classes, record size), the current epoch and a clean-stop flag.
//	slab.lock      flock(2) guard so that two processes never open one directory.
//	slots.tbl      sparse table of 64-byte CRC-protected records, one per slot, at offset
//	               (extent*ExtentBytes/4096 + slot)*64; rebuilt in bulk at Open.
//	extents/NNNNNN fallocated extent files of ExtentBytes each; slot i of an extent of
//	               class c lives at offset i*classSize(c). Payloads use O_DIRECT|O_DSYNC.
//
// A Put writes its record, then its payload and the record's group commit side by side, and
// publishes the value in the index only when both are durable. A crash can therefore leave
// a record whose payload never landed (torn, or a previous tenant's bytes), or an evicted
// value's record over a new payload; CRC32C checks on every read make those misses, so the
// engine never serves a half-written value or an older version after an acknowledged
// overwrite: at worst a value is missing. A slot is reused only after every reader that
// pinned it has finished, and after its tombstone is durable unless the reusing Put's own
// record (same table address) replaces the old record.
//
// Eviction is on demand: a Put whose size class is full evicts the class's next CLOCK victim
// (reads and store.Toucher add to a slot's reference count, up to 3, and each pass of the
// hand takes one; new values start at zero, so values never reused go first) or takes over a colder extent of another class.
package slab
