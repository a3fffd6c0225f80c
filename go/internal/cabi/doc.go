// Package cabi is the pure-Go core of the C ABI v2 (libdfkv.so): option validation, the
// handle table, and every dfkv_* call expressed over Go slices with the ABI's return rules
// (0/-1 for puts and batch calls, 1/0 for gets/exists/removes, per-item outputs that start
// as failure). The cgo layer in go/cmd/libdfkv only converts C pointers to slices, so
// everything here is unit-tested without cgo.
package cabi
