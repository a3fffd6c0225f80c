// Package onesided is dfkv's RDMA data plane over the verbs seam: the bootstrap on an
// existing TCP data connection (a dcp offer and answer), then requests and replies over
// one RC queue pair per connection — v2 one-sided as below, or v1 (DCP1) SEND/RECV both
// ways (v1.go), as negotiated.
//
//   - Every request is an RDMA WRITE_WITH_IMM of a dfkv request prefix (plus, for GET, the
//     client's {addr, rkey, len} targets) into slot imm of the connection's lease of the
//     server's process-wide registered receive segment. A PUT first WRITEs its payload to
//     the slot's page-aligned payload offset; RC ordering places it before the immediate.
//   - The server stores a PUT straight from the slot, answers a GET by RDMA-WRITEing the
//     value from a registered staging slot into the targets, and completes every request
//     with a small SEND of a dfkv response prefix, in request order.
//   - A GET's staging slot stays pinned until that SEND's signaled completion, so a client
//     that races ahead can never have its next request overwrite bytes still in flight.
//
// The slot geometry is dcp.SlotSize(max_block); a lease is depth slots. Negotiation and
// validation are in package dcp.
package onesided
