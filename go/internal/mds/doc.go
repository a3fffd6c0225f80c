// Package mds is the dfkv membership directory: the handlers behind dfkv_mds.
//
// The MDS is stateless. All state lives in etcd under
//
//	/dfkv/v1/groups/<group>/members/<id>   one cache node (a wire.Member table)
//	/dfkv/v1/groups/<group>/clients/<id>   one registered cache consumer (a wire.ClientInfo table)
//
// Each key is bound to its own etcd lease. A holder (node or client) registers once and
// then heartbeats through any MDS replica; the replica renews the key's lease on the
// holder's behalf (the concurrency.Session shape, with the keep-alive driven by the
// holder's heartbeats instead of a goroutine). The lease id is read back from the key
// itself, so every replica can renew every lease. A holder that stops heartbeating
// disappears when its lease expires.
//
// ListTopology answers the HLT1 topology with two epochs computed from the content, so that
// every replica answers identically: MembersEpoch hashes the placement content (ids,
// addresses, weights, eligibility) and TopologyEpoch also covers versions, configuration
// and rails.
//
// etcd access sits behind the Store interface: EtcdStore is the real one, MemStore an
// in-memory fake with the same lease semantics for tests.
package mds
