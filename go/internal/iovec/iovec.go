package iovec

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Max is the most entries one system call takes (IOV_MAX).
const Max = 1024

// Append appends an entry for every non-empty segment to dst and returns it with the
// segments' total length.
func Append(dst []unix.Iovec, segs [][]byte) ([]unix.Iovec, int) {
	total := 0
	for _, s := range segs {
		if len(s) > 0 {
			v := unix.Iovec{Base: &s[0]}
			v.SetLen(len(s))
			dst = append(dst, v)
			total += len(s)
		}
	}
	return dst, total
}

// Msghdr is a message over the first Max entries of iov (which must not be empty).
func Msghdr(iov []unix.Iovec) unix.Msghdr {
	msg := unix.Msghdr{Iov: &iov[0]}
	msg.SetIovlen(min(len(iov), Max))
	return msg
}

// Advance drops the first n bytes of iov (what a call transferred) and returns the rest;
// a partly transferred entry is shortened in place.
func Advance(iov []unix.Iovec, n int) []unix.Iovec {
	for n > 0 && len(iov) > 0 {
		if l := int(iov[0].Len); n >= l {
			n -= l
			iov = iov[1:]
			continue
		}
		iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), n))
		iov[0].Len -= uint64(n)
		n = 0
	}
	return iov
}
