// Package dcp is the RDMA bootstrap tail (schema/dcp.fbs): after the Hello exchange on the
// TCP data port the client sends its DcpTail offer and the server answers with its own,
// which fixes the connection's protocol. "DCP1" (or no tail) is v1 SEND/RECV; "DCP2" is v2
// one-sided (PUT: WRITE_WITH_IMM into a leased slot of the server's receive segment; GET:
// the server RDMA-WRITEs into targets the client advertises).
//
// Negotiation is connection-local and never changes a live QP: a v2 offer answered v1 makes
// the client drop that connection and open a fresh one offering v1 (ErrFallbackV1). Every
// field is validated fail-closed, so a bad tail is refused with a clear error and affects
// nothing else.
package dcp
