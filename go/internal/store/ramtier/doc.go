// Package ramtier is the RAM hot tier of a cache node: a store.Engine that keeps recently
// written and read values in a preallocated memory arena in front of a disk engine.
//
// Arena. One anonymous mmap of ArenaBytes, allocated (and pre-faulted) once at New and
// never grown; the GC does not scan it. It is split into Shards equal shards, each with its
// own lock, index and allocator. A shard allocates 4096-aligned slots of
// AlignUp(value length) bytes in a ring (first in, first out): new slots are carved at the
// head, room is made by retiring the oldest slots at the tail. No request allocates
// buffer memory: values move between sockets, disks and arena slots directly.
//
// Pins. A slot carries a pin count. Its owner pins it from reservation until it has
// finished filling it (socket read for a PUT, O_DIRECT disk read for a promotion); every
// reader pins it for the whole Get callback (the server's socket write), and read
// coalescing pins it on behalf of each follower before the follower can see it. The tail
// only advances over slots that are unpinned and either durable (live: their value is on
// disk) or dead (replaced, removed or aborted). A slot is therefore never reused while any
// I/O uses it, and a value is never dropped from RAM before it is durable.
//
// Backpressure. When the tail is pinned, an allocation waits (at most WaitTimeout) for a
// pin to drop; after that the request goes around the tier (PUT writes only to disk, GET
// reads through the disk engine) and dfkv_ram_bypassed_total counts it. Nothing queues
// without bound.
//
// Writes. Write-through (default): a PUT is read from the socket straight into a fresh
// slot, written to the backing engine from that slot (store.DirectWriter: O_DIRECT from
// the arena, no staging copy), acknowledged after the disk write, and then published in
// the index so that it stays warm. Write-around: the PUT goes to disk only and any RAM
// copy of the key is dropped.
//
// Write-back (writeback.go): a PUT charges its slot to the dirty budget (bounded wait, then
// store.ErrBusy), fills the slot and publishes it dirty: served at once, never retired by
// the ring. Flushers write dirty slots through the same DirectWriter path, in ack order;
// a slot no longer its key's value when its turn comes is dropped unwritten. Crash
// contract: latest acknowledged value or a miss. An overwrite of a key with a durable older
// version removes that version from disk before the ack, and a per-stripe disk lock orders
// flushes against those removals, REMOVEs and writes around the tier, so no flush lands
// after a newer version. Close drains every dirty slot (bounded by DrainTimeout). ForEach
// lists the disk only: dirty keys are not listed until flushed.
//
// Reads. A warm GET pins the slot and hands the arena slice to the callback: no disk I/O
// and no copy besides the socket write; it calls store.Touch on the backing engine so that
// the disk's eviction counts the use (it would otherwise evict the hottest values first). A cold GET reserves a slot of the value's padded
// size and reads the disk straight into it (store.DirectReader: one O_DIRECT read, CRC
// verified), then publishes it (promotion) and serves it from there. Values larger than
// MaxValueBytes are never cached.
//
// Consistency. Outside write-back, RAM only ever holds a value that is on disk. Every PUT and REMOVE bumps a
// per-key-stripe epoch and counts itself active while it runs; removals reported by the
// backing engine (eviction, failed verification) bump it too and drop the RAM copy. A
// promotion is published only if no write or removal touched the stripe while it read; a
// PUT only if it was the stripe's only writer. Otherwise the slot is retired and the next
// GET reads the disk again.
//
// Coalescing (Config.Coalesce): concurrent misses of one key share one disk read: the
// leader reads into the arena slot and followers are served from it (pinned for them);
// a follower whose leader stalls reads on its own after CoalesceTimeout.
package ramtier
