//go:build !linux

package tcp

// fixedBuffers leaves the buffers to the system where its limits are not known.
func fixedBuffers() (read, write bool) { return false, false }
