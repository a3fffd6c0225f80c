// Package transport is the seam between the dfkv protocol and the bytes' carrier. TCP is
// always available (transport/tcp); RDMA plugs in beside it behind the same interfaces.
// A transport hands out stream connections (net.Conn); framing stays in package wire.
package transport
