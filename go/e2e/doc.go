// Package e2e holds end-to-end tests that start the real dfkv binaries on loopback ports
// and drive them through the client library, dfkvctl and raw sockets. Set DFKV_BIN_DIR to
// reuse binaries built by tools/build.sh; otherwise TestMain builds them.
package e2e
