package ramtier

import "golang.org/x/sys/unix"

// mapPopulate pre-faults the arena at allocation (Linux MAP_POPULATE) so that the first
// writes into it do not take page faults on the request path.
const mapPopulate = unix.MAP_POPULATE
