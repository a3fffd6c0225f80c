// Package soft is a software RDMA NIC implementing the verbs seam with the semantics of an RC
// queue pair, across processes on one host. It is a test and demo fabric, selected only
// explicitly (--rdma-provider soft / DFKV_RDMA_PROVIDER=soft); it makes no performance claim.
//
// Each device listens on an abstract unix socket named after its GID. A requester QP dials
// its peer's device on its first send and says which QP it wants; from then on that stream
// carries the requester's work requests one way and the responder's ACK/NAK/read responses
// the other way, in order, which is what gives RC ordering. Payload bytes go from the
// sender's registered memory straight into the socket (writev) and from the socket straight
// into the responder's registered memory, after the responder checked the rkey, the
// protection domain, the MR's and the QP's access flags and the bounds — the checks a
// hardware responder makes. Sockets rather than shared memory so that any memory can be
// registered, as on hardware, and every check happens on the side that owns the memory.
//
// Failures are reported as hardware reports them: a failed remote check NAKs the request,
// whose WR completes with StatusRemAccessErr (or RemInvReqErr, RNRRetryExcErr), and both QPs
// move to ERR; everything still queued completes with StatusWRFlushErr. A peer that dies (or
// destroys its QP) closes the streams, which moves the QP to ERR the same way (transport
// retry exceeded for the WR in flight). Where hardware would retry forever (rnr_retry 7) the
// soft NIC gives up after Options.RNRTimeout, so tests cannot hang.
package soft
