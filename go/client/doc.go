// Package client is the dfkv client library: it names keys with package identity, routes
// them over a Ketama ring of cache nodes (from a Membership source), keeps per-peer pools of
// keep-alive connections, fans batches out concurrently, and moves values directly between
// the caller's buffers and the sockets. A miss, a dead node or a cooling-down peer is a clean
// ErrNotFound/ErrUnavailable, never a hang: every wait has a deadline.
package client
