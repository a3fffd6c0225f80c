// Package secure holds dfkv's transport security and tenant authorization: TLS 1.3
// configurations whose certificates reload from disk without dropping connections (TLS),
// listener and dialer wrappers at the transport seam, and the tenant token table that
// decides which tenants and rights (read, write, remove, admin) a token grants (Tokens).
//
// Tokens are compared in constant time and never logged; a reload swaps the whole table
// atomically, and connections re-resolve their token when the table's generation changes,
// so a revoked token stops working on open connections too.
package secure
