package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RegisterDMABuf registers the DMA-BUF fd (bytes [offset, offset+size) of it) as device
// memory on every RDMA device the client uses, now (the default device is opened if none
// is yet, so a NIC that cannot import DMA-BUFs refuses here) and on devices opened later.
// iova is the address the caller names that memory by (for a CUDA allocation its device
// pointer): GET destinations that lie in [iova, iova+size) are served only by RDMA WRITEs
// of the owner's server straight into it — never copied by the CPU, never over TCP,
// never through a host staging buffer, never from a hot key's replica — and fail with
// ErrDirectUnsupported when that is not possible. Such destination slices alias device
// memory: dfkv never reads or writes them on the host. PUT sources there are refused.
//
// Without RDMA, or when the NIC refuses the registration, the error wraps
// ErrDirectUnsupported (and the driver's errno, e.g. syscall.EOPNOTSUPP). The fd may be
// closed after the call (the registration holds its own descriptor). The memory must stay
// allocated until UnregisterDMABuf or Close returns.
func (c *Client) RegisterDMABuf(fd int, offset, size, iova uint64) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if fd < 0 || size == 0 || iova == 0 || iova+size < iova {
		return fmt.Errorf("dfkv: register dmabuf: fd %d, %d bytes at %#x: %w", fd, size, iova, ErrInvalid)
	}
	if c.opts.RDMA == nil {
		return fmt.Errorf("dfkv: register dmabuf: the client has no RDMA (device memory is written only by RDMA): %w", ErrDirectUnsupported)
	}
	err := c.rdma.RegisterDMABuf(fd, offset, size, iova)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, verbs.ErrDMABufUnsupported), errors.Is(err, verbs.ErrUnavailable), errors.Is(err, verbs.ErrNoDevice):
		return fmt.Errorf("%w: %w", ErrDirectUnsupported, err)
	case errors.Is(err, verbs.ErrInvalid):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return err
}

// UnregisterDMABuf undoes RegisterDMABuf for exactly [iova, iova+size) (else ErrInvalid).
// New GETs into it stop being direct at once; it waits for the queued and in-flight GETs
// that target it (at most twice the I/O timeout, else ErrBusy and it stays registered),
// then deregisters it on every device. After it returns nil no remote write can reach the
// memory (a connection that broke with a GET outstanding destroyed its QP before letting
// go) and the caller may free it.
func (c *Client) UnregisterDMABuf(iova, size uint64) error {
	if size == 0 || iova == 0 {
		return fmt.Errorf("dfkv: unregister dmabuf: %d bytes at %#x: %w", size, iova, ErrInvalid)
	}
	return c.rdma.UnregisterDMABuf(iova, size)
}

// noDeviceSource refuses a PUT whose value lies in registered device memory: the TCP path
// would read it on the host.
func (c *Client) noDeviceSource(segs [][]byte) error {
	d, err := c.rdma.Direct(segs)
	if err != nil {
		return err
	}
	if d {
		return fmt.Errorf("dfkv: put: the value lies in registered device memory (direct saves are not supported; copy it to the host): %w", ErrInvalid)
	}
	return nil
}

// directGet is get for a destination in device memory: one RDMA GET from the key's
// primary into registered targets, or ErrDirectUnsupported; never TCP, staging or a
// replica.
func (c *Client) directGet(ctx context.Context, id identity.ObjectID, segs [][]byte, flags uint8, off, length uint64, kind opKind, start time.Time) (uint64, error) {
	n, err := c.directGetOnce(ctx, id, segs, flags, off, length)
	c.m.directDone(err)
	c.m.directSeconds.Observe(time.Since(start).Seconds())
	c.m.done(kind, err, int64(n), start)
	return n, err
}

func (c *Client) directGetOnce(ctx context.Context, id identity.ObjectID, segs [][]byte, flags uint8, off, length uint64) (uint64, error) {
	p, err := c.route(id)
	if err != nil {
		return 0, err
	}
	op := &onesided.Op{Kind: fb.OpGet, Tenant: c.tenant, ID: id, Dst: segs, Direct: true}
	if flags == 0 {
		op.Offset, op.Length = off, length
	}
	done, err := c.rdmaExec(ctx, p, op)
	switch {
	case !done:
		return 0, c.directRefusal(p, nil)
	case op.Refused != nil:
		return 0, c.directRefusal(p, op.Refused)
	case err != nil:
		return 0, err
	}
	ok, n, err := c.rdmaGetResult(op, flags, length)
	if !ok {
		return 0, fmt.Errorf("dfkv: direct get: stored %d bytes, above the RDMA block of %d: %w", op.ValueLen, c.rdmaBlock(), ErrDirectUnsupported)
	}
	return n, err
}

// directRefusal says why a direct GET to p cannot run: the connection's refusal, else p is
// not served over RDMA (the transport's reason).
func (c *Client) directRefusal(p *peer, refused error) error {
	if refused != nil {
		return fmt.Errorf("dfkv: direct get from %s: %w: %w", p.addr, ErrDirectUnsupported, refused)
	}
	return fmt.Errorf("dfkv: direct get from %s: not served over RDMA (%s): %w", p.addr, c.rdma.Mode(), ErrDirectUnsupported)
}

// notDirect fails the direct items of a chunk p serves over TCP and returns the others.
func (c *Client) notDirect(p *peer, items []*Item) []*Item {
	rest := items[:0:0]
	for _, it := range items {
		if it.direct {
			it.Err = c.directRefusal(p, nil)
			continue
		}
		rest = append(rest, it)
	}
	return rest
}
