// Package railset is a client's RDMA connections to its servers and the rail policy that
// places them (docs/RDMA.md §4, docs/rdma/RAILS.md): per server, a bounded pool of
// connections and an SG lane (depth-1 connections for multi-SGE requests), idle reclaim,
// the refusal backoff that keeps a server on TCP after it refused RDMA, and one shared
// device per rail with the caller's registered memory on it. Rail choice is tiers (health
// picks the tier), the primary, NUMA locality, round robin and latency demotion inside
// the tier, per-rail credits (an op waits for its tier, never spills to a lower one),
// quarantine with active probing, and the replay contract (reads and never-posted writes
// run again on another rail; a write that may have run is returned as an error).
//
// The caller (go/client) keeps routing and request semantics: it builds onesided.Ops and
// calls Peer.Exec or Peer.Run once per operation; the transport picks the rail, retries
// what may be retried, and says what was not sent (the caller's TCP path serves it). The
// caller's side of each server is a Host: the TCP bootstrap request and peer health.
package railset
