package client

import "fmt"

// RegisterDMABuf registers the DMA-BUF fd (bytes [offset, offset+size) of it) as device
// memory on every RDMA device the client uses, now and on devices opened later. iova is
// the address the caller names that memory by (for a CUDA allocation its device pointer):
// GET destinations that lie in [iova, iova+size) are served only by RDMA WRITEs of the
// owner's server straight into it — never copied by the CPU, never over TCP, never through
// a host staging buffer (ErrDirectUnsupported when that is not possible). Such destination
// slices alias device memory: dfkv never reads or writes them on the host.
//
// The fd may be closed after the call (the registration holds its own reference). The
// memory must stay allocated until UnregisterDMABuf or Close returns.
func (c *Client) RegisterDMABuf(fd int, offset, size, iova uint64) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if fd < 0 || size == 0 || iova == 0 || iova+size < iova {
		return fmt.Errorf("dfkv: register dmabuf: fd %d, %d bytes at %#x: %w", fd, size, iova, ErrInvalid)
	}
	return fmt.Errorf("dfkv: register dmabuf: %w", ErrDirectUnsupported)
}

// UnregisterDMABuf undoes RegisterDMABuf for exactly [iova, iova+size). New GETs into it
// fail at once (ErrInvalid: not registered); it waits for the queued and in-flight GETs
// that target it (at most twice the I/O timeout, else ErrBusy and it stays registered),
// then deregisters it on every device. After it returns nil no remote write can reach the
// memory and the caller may free it.
func (c *Client) UnregisterDMABuf(iova, size uint64) error {
	return fmt.Errorf("dfkv: unregister dmabuf: %d bytes at %#x: %w", size, iova, ErrInvalid)
}
