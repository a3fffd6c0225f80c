// Package kvevents publishes a node's KV events in vLLM's format (docs/EVENTS.md): a ZMQ
// PUB stream of [topic, 8-byte big-endian sequence, msgpack EventBatch] frames and a
// ROUTER socket that replays buffered batches from a sequence number, so cache-aware
// routers (llm-d's kv-cache indexer, vLLM's own subscriber) can track what dfkv holds.
//
// Publishing never blocks the data path: events go through a bounded queue, and an event
// that finds it full is dropped, counted, and shows as a gap in the sequence.
//
// It uses go-zeromq/zmq4 (pure Go ZMTP 3, interoperates with libzmq peers) and
// vmihailenco/msgpack (pure Go): no cgo and no system libzmq, so the hermetic Bazel build
// and the static binaries stay as they are.
package kvevents
