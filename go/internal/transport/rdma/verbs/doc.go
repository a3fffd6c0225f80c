// Package verbs is the seam between dfkv's RDMA data plane and the NIC: a small Go interface
// at the level of the verbs objects (device, protection domain, memory region, completion
// queue, reliable-connected queue pair) with their semantics, nothing above them.
//
// Everything above this package (bootstrap, v1/v2 protocols, segments, pools) is written
// against these interfaces only, so it runs in tests on machines without RDMA hardware.
// Two providers implement the seam:
//
//   - verbs/soft: a software NIC in Go that gives the same semantics across processes on one
//     host (keys, remote access checks, RC ordering, immediates, flush on error and on peer
//     death). A test and demo fabric, selected only explicitly.
//   - verbs/ibverbs: cgo over rdma-core's libibverbs loaded at run time with dlopen, so one
//     binary runs with and without rdma-core installed.
//
// The model follows libibverbs closely on purpose (names, states, status codes), so code
// written against the seam maps one to one onto ibv_* calls:
//
//   - A QP moves RESET -> INIT -> RTR -> RTS by Modify; any error moves it to ERR, after which
//     every queued and newly posted work request completes with StatusWRFlushErr.
//   - PostSend/PostRecv only queue work; results arrive as WorkCompletions on the QP's CQs.
//     Unsignaled successful sends produce no completion; errors always do.
//   - Completions on one QP arrive in posting order (RC ordering): a signaled SEND completes
//     only after every earlier WRITE on that QP has been placed at the responder.
//   - Remote access errors (bad rkey, out of bounds, missing permission) complete the
//     requester's WR with StatusRemAccessErr and move the QP to ERR.
//
// Memory handed to RegMR must stay valid and unmoved until the MR is closed. Go's collector
// does not move heap objects, but cgo forbids C from keeping Go pointers, so the ibverbs
// provider needs memory from outside the Go heap: use AllocBuffer (mmap) for buffers that
// are registered with it.
package verbs
