// Package mdsclient speaks the MDS control protocol from the caller's side: Client sends one
// MdsRequest frame at a time to a list of dfkv_mds replicas and fails over between them by
// itself (there is no load balancer), and Holder keeps a registration (a cache node in the
// ring, or a cache consumer under the clients prefix) alive with heartbeats, re-registering
// when the MDS has forgotten it. It does not import etcd: only dfkv_mds talks to etcd.
package mdsclient
