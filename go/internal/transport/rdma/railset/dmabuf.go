package railset

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
)

// ErrDirectUnsupported is go/client's sentinel of the same name (a load into device memory
// that cannot be served directly).
var ErrDirectUnsupported = errors.New("dfkv: direct device load not possible")

// dmabuf is one RegisterDMABuf range: the set keeps its own descriptor of the buffer to
// register it on devices opened later.
type dmabuf struct {
	fd               int
	offset, size     uint64
	iova             uint64
	unregistering    bool
	lastRegisterFail error // the latest device that refused it (Mode, logs)
}

func (b *dmabuf) contains(a, n uint64) bool { return a >= b.iova && a+n <= b.iova+b.size }
func (b *dmabuf) overlaps(a, n uint64) bool { return a < b.iova+b.size && b.iova < a+n }

// RegisterDMABuf registers device memory (go/client's RegisterDMABuf documents the
// contract) on every device open now, opening the default one when none is yet, so a NIC
// that cannot import DMA-BUFs refuses here, and on every device opened later. The error
// of a refusal wraps verbs.ErrDMABufUnsupported.
func (s *Set) RegisterDMABuf(fd int, offset, size, iova uint64) error {
	prov, err := s.provider()
	if err != nil {
		return fmt.Errorf("dfkv: register dmabuf: %w", err)
	}
	if len(s.devsSnapshot()) == 0 {
		if _, err := s.device(prov, ""); err != nil {
			return fmt.Errorf("dfkv: register dmabuf: open device: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.o.Errors.Closed
	}
	for _, b := range s.dmabufs {
		if b.iova == iova && b.size == size && !b.unregistering {
			return nil
		}
		if b.overlaps(iova, size) {
			return fmt.Errorf("dfkv: register dmabuf [%#x, +%d): overlaps [%#x, +%d): %w", iova, size, b.iova, b.size, s.o.Errors.Invalid)
		}
	}
	for _, r := range s.regions {
		if (&dmabuf{iova: addrOf(r), size: uint64(len(r))}).overlaps(iova, size) {
			return fmt.Errorf("dfkv: register dmabuf [%#x, +%d): overlaps registered host memory: %w", iova, size, s.o.Errors.Invalid)
		}
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dfkv: register dmabuf: fd %d: %w: %w", fd, s.o.Errors.Invalid, err)
	}
	done := make([]*onesided.Device, 0, len(s.devs))
	for name, dev := range s.devs {
		if err := dev.RegisterDMABuf(own, offset, size, iova); err != nil {
			for _, d := range done { // all devices or none
				_ = d.UnregisterDMABuf(context.Background(), iova, size)
			}
			unix.Close(own)
			return fmt.Errorf("dfkv: register dmabuf on %q: %w", name, err)
		}
		done = append(done, dev)
	}
	s.dmabufs = append(s.dmabufs, &dmabuf{fd: own, offset: offset, size: size, iova: iova})
	s.publishLocked()
	return nil
}

// UnregisterDMABuf undoes RegisterDMABuf for exactly [iova, +size): new direct GETs into it
// fail at once; it waits for the queued and in-flight ones (at most twice the I/O timeout,
// else Busy and it stays registered), then deregisters it on every device.
func (s *Set) UnregisterDMABuf(iova, size uint64) error {
	s.mu.Lock()
	var b *dmabuf
	for _, x := range s.dmabufs {
		if x.iova == iova && x.size == size && !x.unregistering {
			b = x
		}
	}
	if b == nil {
		s.mu.Unlock()
		return fmt.Errorf("dfkv: unregister dmabuf: %d bytes at %#x were not registered: %w", size, iova, s.o.Errors.Invalid)
	}
	b.unregistering = true
	s.publishLocked()
	devs := make([]*onesided.Device, 0, len(s.devs))
	for _, d := range s.devs {
		devs = append(devs, d)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.o.IOTimeout)
	defer cancel()
	var first error
	for _, dev := range devs {
		err := dev.UnregisterDMABuf(ctx, iova, size)
		switch {
		case err == nil, errors.Is(err, onesided.ErrNotRegistered):
		case errors.Is(err, onesided.ErrPoolBusy):
			if first == nil {
				first = fmt.Errorf("dfkv: unregister dmabuf: %w: %w", s.o.Errors.Busy, err)
			}
		default:
			if first == nil {
				first = fmt.Errorf("dfkv: unregister dmabuf: %w", err)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first != nil && errors.Is(first, s.o.Errors.Busy) {
		b.unregistering = false // still registered somewhere: a later call retries
		s.publishLocked()
		return first
	}
	for j, x := range s.dmabufs {
		if x == b {
			s.dmabufs = append(s.dmabufs[:j], s.dmabufs[j+1:]...)
			break
		}
	}
	s.publishLocked()
	unix.Close(b.fd)
	return first
}

// Direct reports whether any of segs lies in registered device memory (such an op is
// served only over RDMA into registered targets). A piece that straddles the edge of a
// registered range is Invalid.
func (s *Set) Direct(segs [][]byte) (bool, error) {
	ranges := s.dmaRanges.Load() // lock-free: every GET asks
	if ranges == nil || len(*ranges) == 0 {
		return false, nil
	}
	direct := false
	for _, g := range segs {
		if len(g) == 0 {
			continue
		}
		a, n := addrOf(g), uint64(len(g))
		for _, b := range *ranges {
			if !b.overlaps(a, n) {
				continue
			}
			if !b.contains(a, n) {
				return false, fmt.Errorf("dfkv: %d bytes at %#x straddle registered device memory [%#x, +%d): %w", n, a, b.iova, b.size, s.o.Errors.Invalid)
			}
			if b.unregistering {
				return false, fmt.Errorf("dfkv: device memory [%#x, +%d) is being unregistered: %w", b.iova, b.size, ErrDirectUnsupported)
			}
			direct = true
		}
	}
	return direct, nil
}

// publishLocked refreshes the ranges Direct reads. s.mu is held.
func (s *Set) publishLocked() {
	r := make([]dmabuf, 0, len(s.dmabufs))
	for _, b := range s.dmabufs {
		r = append(r, dmabuf{iova: b.iova, size: b.size, unregistering: b.unregistering})
	}
	s.dmaRanges.Store(&r)
}

// registerDMABufs registers the set's device memory on a newly opened device. A device that
// refuses keeps serving host memory; direct GETs routed over it are refused (nothing of
// them is posted). s.mu is held.
func (s *Set) registerDMABufs(name string, dev *onesided.Device) {
	for _, b := range s.dmabufs {
		if b.unregistering {
			continue
		}
		if err := dev.RegisterDMABuf(b.fd, b.offset, b.size, b.iova); err != nil {
			b.lastRegisterFail = err
			s.o.Logger.Warn("dfkv: device memory not registered on a newly opened RDMA device: direct loads over it are refused",
				"device", name, "iova", b.iova, "bytes", b.size, "err", err)
		}
	}
}

// closeDMABufs releases the set's descriptors (Close, after the devices). s.mu is held.
func (s *Set) closeDMABufs() {
	for _, b := range s.dmabufs {
		unix.Close(b.fd)
	}
	s.dmabufs = nil
}

func (s *Set) devsSnapshot() []*onesided.Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*onesided.Device, 0, len(s.devs))
	for _, d := range s.devs {
		out = append(out, d)
	}
	return out
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
