// Package tcp is the TCP transport: listeners and dialers with TCP_NODELAY, keep-alive and
// socket buffers sized for multi-megabyte values.
package tcp
