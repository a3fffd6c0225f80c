// Package tagged keeps the engine identity (wire.ObjectTag) of stored objects beside a
// storage engine and reports their lifecycle to a Sink (the KV-event publisher): Stored
// when a tag is attached to a stored object, Removed when that object is evicted,
// removed or overwritten, Cleared when the node starts without its data.
//
// Tags live in memory and in an append-only log (kvtags.log) in the first data directory,
// compacted at every open. A directory without the log (every store written before tags
// existed) opens and serves as before; its objects have no tag and publish nothing.
package tagged
