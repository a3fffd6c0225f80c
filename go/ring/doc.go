// Package ring is the weighted Ketama consistent-hash ring that routes an object id to a
// node (and, inside a node, to a disk). Point placement is a cross-language contract:
// the Python package computes the same owners, checked by shared golden vectors.
package ring
