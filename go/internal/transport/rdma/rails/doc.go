// Package rails is a server's view of its RDMA rails (the devices it serves on): which
// devices are configured, in which selection tier (--rdma-tiers), which one is preferred
// (--rdma-primary-dev), and how healthy each is right now. A Monitor re-queries the
// provider periodically and publishes each rail as a wire.Rail for the member's HLT1
// record: a rail goes Down at once when its query fails or its port leaves ACTIVE, and
// comes back through Quarantined, Healthy only after RecoverySamples consecutive healthy
// samples, so a flapping port does not flap the topology. Every health change bumps the
// rail's generation and tells the caller, which re-registers the member; the MDS then moves
// topology_epoch (not members_epoch: placement is unchanged).
package rails
