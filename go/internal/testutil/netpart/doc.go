// Package netpart cuts links between processes on one machine, for tests and harnesses
// that partition a real cluster. The caller re-runs itself in a network namespace of its
// own (Command: `unshare --net`), so the nftables drop rules it installs there (Table)
// touch nothing outside; every process it starts then lives on that namespace's loopback.
// Linux only: it needs root, util-linux, iproute2 and nftables (Check says what is missing).
package netpart
