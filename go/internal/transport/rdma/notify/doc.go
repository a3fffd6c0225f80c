// Package notify carries native RDMA notifications: small named messages sent by SEND/RECV
// on a notification QP of their own, one per endpoint (connection), so that control traffic
// of an RDMA connection (drain notices, application completion notices) needs no round trip
// over the TCP bootstrap connection.
//
// A Hub is one device context's notification side: a shared set of completion queues that
// grows as endpoints are added (up to a capacity), a registered-buffer budget, and the
// routing of completions to endpoints by (endpoint id, generation) carried in the wr_id. An
// Endpoint's generation moves every time its QP is torn down (Release, Restart), so a
// completion of an older QP is dropped, never delivered to the QP that replaced it.
//
// Flow control is by credits: each side posts Credits receive buffers for messages plus a
// reserve of two for credit returns; credits come back piggybacked on messages or in a
// credit message once half of them are outstanding. A Send that finds no credit or no free
// send buffer waits, bounded by its context and Config.SendTimeout, then fails with
// ErrBackpressure. A nil error from Send means local submission, not remote receipt; a send
// whose fate is unknown (the QP broke) is never replayed.
package notify
