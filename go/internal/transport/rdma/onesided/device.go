package onesided

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// ErrNotRegistered: UnregisterMemory of a range that RegisterMemory did not register.
var ErrNotRegistered = errors.New("onesided: memory range not registered")

// ErrPoolBusy: UnregisterMemory gave up waiting for the in-flight ops that use the range;
// the range stays registered.
var ErrPoolBusy = errors.New("onesided: registered memory in use by in-flight ops")

// Device is one opened device (verbs context) and its protection domain, shared by every
// connection of a client on that device: QPs, CQs and per-connection buffers are per
// connection, the PD and the pool MRs (RegisterMemory) per device, so a pool is registered
// once however many connections use it.
//
// A Device is reference counted: OpenDevice hands the caller one reference, each connection
// dialled on it (Config.Shared) takes another; the PD and context are released, after the
// pool MRs, when the last reference is dropped (Release). Its owner therefore closes its
// connections first and releases its reference last, or in any order: teardown waits for
// the last.
type Device struct {
	ctx  verbs.Context
	port verbs.PortInfo
	pd   verbs.PD
	m    *Metrics

	mu    sync.Mutex
	refs  int
	pools []*poolMR
	hub   *notify.Hub // notification CQs and endpoints, made by the first connection that offers them
}

// poolMR is one registered range. refs counts the in-flight ops that use it; UnregisterMemory
// marks it leaving (no new op takes it) and waits for refs to drain.
type poolMR struct {
	mr      verbs.MR
	device  bool // a DMA-BUF (RegisterDMABuf): GET targets only, never touched by the CPU
	refs    int
	leaving bool
	drained chan struct{} // closed when refs reaches 0 while leaving (nil until waited on)
	closed  bool
}

// OpenDevice opens the named device (or the first with an ACTIVE port) and allocates its PD.
// m (may be nil) counts the device, its PD and its pool registrations.
func OpenDevice(p verbs.Provider, name string, m *Metrics) (*Device, error) {
	if m == nil {
		m = new(Metrics)
	}
	ctx, port, err := pickDevice(p, name)
	if err != nil {
		return nil, err
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, fmt.Errorf("onesided: %s: alloc PD: %w", ctx.Info().Name, err)
	}
	m.DevicesOpen.Add(1)
	m.PDsOpen.Add(1)
	return &Device{ctx: ctx, port: port, pd: pd, m: m, refs: 1}, nil
}

// Name is the device's name.
func (d *Device) Name() string { return d.ctx.Info().Name }

// acquireRef takes a reference for a connection; false once the device is torn down.
func (d *Device) acquireRef() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return false
	}
	d.refs++
	return true
}

// Release drops one reference; the last one deregisters the pool MRs, then frees the PD
// and closes the context.
func (d *Device) Release() error {
	d.mu.Lock()
	if d.refs == 0 {
		d.mu.Unlock()
		return nil
	}
	d.refs--
	if d.refs > 0 {
		d.mu.Unlock()
		return nil
	}
	pools := d.pools
	d.pools = nil
	for _, p := range pools {
		p.closed = true
		p.signal()
	}
	d.mu.Unlock()
	// No connection is left: no QP can touch the pools any more.
	for _, p := range pools {
		d.closePool(p)
	}
	if d.hub != nil {
		d.hub.Close()
	}
	d.pd.Close()
	d.m.PDsOpen.Add(-1)
	d.m.DevicesOpen.Add(-1)
	return d.ctx.Close()
}

func (d *Device) closePool(p *poolMR) {
	n := int64(p.mr.Len())
	p.mr.Close()
	if p.device {
		d.m.DMABufDeregs.Add(1)
		d.m.DMABufBytes.Add(-n)
		return
	}
	d.m.MRPoolDeregs.Add(1)
	d.m.MRPoolBytes.Add(-n)
}

// signal wakes an UnregisterMemory waiting on p. d.mu is held.
func (p *poolMR) signal() {
	if p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
}

// RegisterMemory registers buf on this device for zero-copy PUT sources and GET targets,
// used by every connection on it. Registering the same range again is a no-op.
func (d *Device) RegisterMemory(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: register 0 bytes", verbs.ErrInvalid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return fmt.Errorf("onesided: register memory: %w", verbs.ErrClosed)
	}
	if d.exactLocked(buf) != nil {
		return nil
	}
	mr, err := d.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return fmt.Errorf("onesided: %s: register %d bytes: %w", d.Name(), len(buf), err)
	}
	d.m.MRPoolRegs.Add(1)
	d.m.MRPoolBytes.Add(int64(len(buf)))
	d.pools = append(d.pools, &poolMR{mr: mr})
	return nil
}

// RegisterDMABuf registers bytes [offset, offset+size) of the DMA-BUF fd as device memory
// named [iova, iova+size): GET targets there are written by the server's NIC and by
// nothing else. The same range again is a no-op; an overlap with any registered range is
// ErrInvalid. The NIC's refusal wraps verbs.ErrDMABufUnsupported.
func (d *Device) RegisterDMABuf(fd int, offset, size, iova uint64) error {
	if size == 0 || size > 1<<46 || iova == 0 || iova+size < iova {
		return fmt.Errorf("%w: register dmabuf: %d bytes at %#x", verbs.ErrInvalid, size, iova)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return fmt.Errorf("onesided: register dmabuf: %w", verbs.ErrClosed)
	}
	if p := d.exactAddrLocked(iova, int(size)); p != nil {
		if p.device {
			return nil
		}
		return fmt.Errorf("%w: dmabuf at %#x is registered as host memory", verbs.ErrInvalid, iova)
	}
	for _, p := range d.pools {
		if !p.leaving && iova < p.mr.Addr()+uint64(p.mr.Len()) && p.mr.Addr() < iova+size {
			return fmt.Errorf("%w: dmabuf [%#x, +%d) overlaps a registered range [%#x, +%d)", verbs.ErrInvalid, iova, size, p.mr.Addr(), p.mr.Len())
		}
	}
	mr, err := d.pd.RegDMABuf(fd, offset, size, iova, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		d.m.DMABufRegFailures.Add(1)
		return fmt.Errorf("onesided: %s: register dmabuf of %d bytes: %w", d.Name(), size, err)
	}
	d.m.DMABufRegs.Add(1)
	d.m.DMABufBytes.Add(int64(size))
	d.pools = append(d.pools, &poolMR{mr: mr, device: true})
	return nil
}

// UnregisterDMABuf is UnregisterMemory for a RegisterDMABuf range (exactly [iova, +size)).
func (d *Device) UnregisterDMABuf(ctx context.Context, iova, size uint64) error {
	return d.unregister(ctx, iova, int(size), true)
}

// exactLocked returns the live (not leaving) pool registered for exactly buf.
func (d *Device) exactLocked(buf []byte) *poolMR {
	return d.exactAddrLocked(addrOf(buf), len(buf))
}

func (d *Device) exactAddrLocked(a uint64, n int) *poolMR {
	for _, p := range d.pools {
		if !p.leaving && p.mr.Addr() == a && p.mr.Len() == n {
			return p
		}
	}
	return nil
}

// UnregisterMemory deregisters the range buf was registered as (exactly; else
// ErrNotRegistered). New ops stop using it at once; it waits for the in-flight ops that use
// it, until ctx ends (ErrPoolBusy: the range stays registered).
func (d *Device) UnregisterMemory(ctx context.Context, buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: unregister 0 bytes", ErrNotRegistered)
	}
	return d.unregister(ctx, addrOf(buf), len(buf), false)
}

func (d *Device) unregister(ctx context.Context, a uint64, n int, device bool) error {
	d.mu.Lock()
	p := d.exactAddrLocked(a, n)
	if p == nil || p.device != device {
		d.mu.Unlock()
		return fmt.Errorf("%w: %d bytes at %#x", ErrNotRegistered, n, a)
	}
	p.leaving = true
	for p.refs > 0 && !p.closed {
		if p.drained == nil {
			p.drained = make(chan struct{})
		}
		ch := p.drained
		d.mu.Unlock()
		select {
		case <-ch:
			d.mu.Lock()
		case <-ctx.Done():
			d.mu.Lock()
			if p.refs > 0 && !p.closed {
				p.leaving = false
				n := p.refs
				d.mu.Unlock()
				return fmt.Errorf("%w: %d ops still use it: %w", ErrPoolBusy, n, ctx.Err())
			}
		}
	}
	if p.closed { // the device was torn down meanwhile: deregistered with it
		d.mu.Unlock()
		return nil
	}
	for i, q := range d.pools {
		if q == p {
			d.pools = append(d.pools[:i], d.pools[i+1:]...)
			break
		}
	}
	p.closed = true
	d.mu.Unlock()
	d.closePool(p)
	return nil
}

// acquirePool returns the live pool containing b (and b's offset in it) with a reference
// taken for one in-flight op, or nil.
func (d *Device) acquirePool(b []byte) (*poolMR, int) {
	if len(b) == 0 {
		return nil, 0
	}
	a := addrOf(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pools {
		if !p.leaving && a >= p.mr.Addr() && a+uint64(len(b)) <= p.mr.Addr()+uint64(p.mr.Len()) {
			p.refs++
			return p, int(a - p.mr.Addr())
		}
	}
	return nil, 0
}

// releasePool drops an op's reference on p.
func (d *Device) releasePool(p *poolMR) {
	d.mu.Lock()
	p.refs--
	if p.refs == 0 {
		p.signal()
	}
	d.mu.Unlock()
}
