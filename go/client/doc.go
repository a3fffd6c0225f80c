// Package client is the dfkv client library: it names keys with package identity, routes
// them over a Ketama ring of cache nodes (from a Membership source), keeps per-peer pools of
// keep-alive connections, fans batches out concurrently, and moves values directly between
// the caller's buffers and the sockets. A miss, a dead node or a cooling-down peer is a clean
// ErrNotFound/ErrUnavailable, never a hang: every wait has a deadline.
//
// Every call that talks to a node takes a context.Context first. Its deadline bounds the
// call together with Options.IOTimeout (the earlier wins); cancelling it interrupts a
// request blocked on the network at once, and the interrupted connection is closed, never
// reused. The error then wraps the context's error (errors.Is(err, context.Canceled)); a
// passed deadline is also ErrTimeout, a miss. A context that cannot be cancelled
// (context.Background) costs nothing beyond the deadline.
//
// Errors start with "dfkv: " and wrap their causes: branch on the sentinel errors with
// errors.Is. The package reads no environment variables; every setting is an option (the C
// ABI and the binaries turn DFKV_* variables into options).
package client
