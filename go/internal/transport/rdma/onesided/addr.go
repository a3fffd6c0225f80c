package onesided

import "unsafe"

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// addrOf0 is addrOf for a slice that may have zero length but a valid base.
func addrOf0(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
