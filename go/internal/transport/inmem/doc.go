// Package inmem is an in-memory data-plane transport (hashicorp/raft's InmemTransport is
// the model): a Network of named listeners that the client dials through the same
// transport.Dialer seam as TCP, without sockets. Tests use it to partition a node, delay
// its traffic, or turn its connections into black holes, and check that the client fails
// fast, never hangs past its deadlines, and recovers when the network heals.
//
// Connections are buffered full-duplex pipes with read and write deadlines, so a protocol
// that writes while its peer writes does not deadlock as it could on net.Pipe.
package inmem
