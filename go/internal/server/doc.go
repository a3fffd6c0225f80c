// Package server is the dfkv cache node's request loop: it accepts data-plane connections
// from a transport, decodes frames with package wire, executes them against a store.Engine
// and streams replies in request order. It owns the per-listener protections (connection
// cap, first-request deadline, I/O deadlines, frame limits) and graceful drain.
package server
