//go:build unix && !linux

package ramtier

// mapPopulate: other Unix systems have no MAP_POPULATE; the arena is faulted in on first
// use instead, which costs latency on the first writes, not correctness.
const mapPopulate = 0
