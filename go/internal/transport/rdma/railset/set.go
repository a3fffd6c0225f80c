package railset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/onesided"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/ibverbs"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// Set is one client's RDMA transport: its provider, one shared device per rail, the
// registered memory, a Peer per server, the rail policy and the idle janitor.
type Set struct {
	o Options

	once    sync.Once
	prov    verbs.Provider
	provErr error

	mu      sync.Mutex
	regions [][]byte  // RegisterMemory's ranges, registered on every device opened
	dmabufs []*dmabuf // RegisterDMABuf's ranges, likewise (dmabuf.go)

	dmaRanges atomic.Pointer[[]dmabuf]    // a copy of dmabufs' ranges for Direct
	devs      map[string]*onesided.Device // per rail, opened by its first connection; shared by all
	closed    bool

	// peersMu is apart from mu, which a device open or a registration holds for long: the
	// janitor, the lane gauge and NewPeer (under the caller's own lock) never wait on those.
	peersMu     sync.Mutex
	peers       []*Peer
	peersClosed bool

	rc railConfig   // rail policy (validated in New)
	rm *railMetrics // per-rail series
	rx railState    // NUMA view, probers
	sg *sgLaneMetrics

	used   atomic.Bool
	reason atomic.Pointer[string]
	m      onesided.Metrics // shared by every RDMA connection of this client

	janitorOnce sync.Once
	stopJanitor chan struct{}
	janitorDone chan struct{}
}

// New validates o's rail policy and returns a Set; it opens nothing until the first op.
func New(o Options) (*Set, error) {
	o.Errors.fill()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	rc, err := newRailConfig(&o, o.Errors.Invalid)
	if err != nil {
		return nil, err
	}
	s := &Set{o: o, rc: rc, rm: newRailMetrics(), sg: newSGLaneMetrics()}
	s.rx.numaNode = o.NUMANode
	if s.rx.numaNode < 0 {
		s.rx.numaNode = callerNUMANode()
	}
	if o.Registerer != nil {
		s.register(o.Registerer)
	}
	return s, nil
}

// fill gives the transport's own errors to a caller that brings none (tests).
func (e *Errors) fill() {
	for _, f := range []struct {
		p    *error
		text string
	}{{&e.Invalid, "invalid"}, {&e.Timeout, "timeout"}, {&e.Closed, "closed"}, {&e.Busy, "busy"}} {
		if *f.p == nil {
			*f.p = errors.New("railset: " + f.text)
		}
	}
	if e.Ctx == nil {
		e.Ctx = func(addr string, err error) error { return fmt.Errorf("%s: %w", addr, err) }
	}
	if e.IO == nil {
		e.IO = e.Ctx
	}
}

func (s *Set) idleTimeout() time.Duration {
	if d := s.o.IdleTimeout; d > 0 {
		return d
	}
	return time.Minute
}

// startJanitor runs the idle reclaim of this client's RDMA pools (once, from the first RDMA
// connection); Close ends and joins it.
func (s *Set) startJanitor() {
	s.janitorOnce.Do(func() {
		s.stopJanitor, s.janitorDone = make(chan struct{}), make(chan struct{})
		idle := s.idleTimeout()
		go func() {
			defer close(s.janitorDone)
			t := time.NewTicker(max(idle/4, time.Millisecond))
			defer t.Stop()
			for {
				select {
				case <-s.stopJanitor:
					return
				case now := <-t.C:
					for _, p := range s.peerList() {
						p.reclaim(now.Add(-idle), &s.m)
					}
				}
			}
		}()
	})
}

func (s *Set) peerList() []*Peer {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	return append([]*Peer(nil), s.peers...)
}

// Close stops the idle reclaim and the probers, closes every connection, then drops the
// set's reference on each device: the last reference deregisters the pools, then frees
// the PD and context.
func (s *Set) Close() {
	s.janitorOnce.Do(func() {}) // none started: none will be
	s.stopProbes()
	if s.stopJanitor != nil {
		close(s.stopJanitor)
		<-s.janitorDone
	}
	s.peersMu.Lock()
	s.peersClosed = true
	s.peersMu.Unlock()
	for _, p := range s.peerList() {
		p.close()
	}
	s.mu.Lock()
	devs := s.devs
	s.devs, s.closed = nil, true
	s.mu.Unlock()
	for _, dev := range devs {
		dev.Release()
	}
	s.mu.Lock()
	s.closeDMABufs()
	s.mu.Unlock()
}

func (s *Set) provider() (verbs.Provider, error) {
	s.once.Do(func() {
		o := &s.o
		switch o.Provider {
		case "", "ibverbs":
			s.prov = ibverbs.New(ibverbs.Options{})
		case "soft":
			// One soft NIC per softN named, or SoftDevices when more (none: one).
			n := 0
			for _, d := range append([]string{o.Device}, o.Devices...) {
				if i, err := strconv.Atoi(strings.TrimPrefix(d, "soft")); err == nil && strings.HasPrefix(d, "soft") && i >= 0 && i < soft.MaxDevices {
					n = max(n, i+1)
				}
			}
			s.prov, s.provErr = soft.New(soft.Options{Devices: max(n, o.SoftDevices, len(o.SoftNUMANodes)),
				FaultFile: o.SoftFaultFile, NUMANodes: o.SoftNUMANodes, NoDMABuf: o.SoftNoDMABuf})
		default:
			s.provErr = fmt.Errorf("rdma provider %q (want ibverbs or soft)", o.Provider)
		}
	})
	return s.prov, s.provErr
}

func (s *Set) setTCPReason(why string) {
	s.reason.Store(&why)
}

// Mode is "rdma" once an RDMA connection is up, else "tcp(<reason>)".
func (s *Set) Mode() string {
	if s.used.Load() {
		return "rdma"
	}
	if r := s.reason.Load(); r != nil {
		return "tcp(" + *r + ")"
	}
	return "tcp(rdma not negotiated yet)"
}

// RegisterMemory registers buf once per device, now and on every device opened later
// (go/client's RegisterMemory documents the contract). The same range again is a no-op.
func (s *Set) RegisterMemory(buf []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.o.Errors.Closed
	}
	if regionIndex(s.regions, buf) >= 0 {
		return nil
	}
	for name, dev := range s.devs {
		if err := dev.RegisterMemory(buf); err != nil {
			for n2, d2 := range s.devs { // undo: all devices or none
				if n2 != name {
					_ = d2.UnregisterMemory(context.Background(), buf)
				}
			}
			return fmt.Errorf("dfkv: register memory on %q: %w", name, err)
		}
	}
	s.regions = append(s.regions, buf)
	return nil
}

// UnregisterMemory undoes RegisterMemory for exactly the range buf was registered as; it
// waits for the in-flight ops that use it (at most twice the I/O timeout, else Busy and the
// range stays registered). An unknown range is Invalid.
func (s *Set) UnregisterMemory(buf []byte) error {
	s.mu.Lock()
	i := regionIndex(s.regions, buf)
	if i < 0 {
		s.mu.Unlock()
		return fmt.Errorf("dfkv: unregister memory: %d bytes at %p were not registered: %w", len(buf), &buf[0], s.o.Errors.Invalid)
	}
	s.regions = append(s.regions[:i], s.regions[i+1:]...)
	devs := make([]*onesided.Device, 0, len(s.devs))
	for _, d := range s.devs {
		devs = append(devs, d)
	}
	s.mu.Unlock()
	// Every op ends within the I/O timeout (its window's deadline), so this wait is bounded.
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.o.IOTimeout)
	defer cancel()
	var first error
	for _, dev := range devs {
		err := dev.UnregisterMemory(ctx, buf)
		switch {
		case err == nil, errors.Is(err, onesided.ErrNotRegistered):
			// Not on the device: it was opened after a failed registration, or closed.
		case errors.Is(err, onesided.ErrPoolBusy):
			if first == nil {
				first = fmt.Errorf("dfkv: unregister memory: %w: %w", s.o.Errors.Busy, err)
			}
		default:
			if first == nil {
				first = fmt.Errorf("dfkv: unregister memory: %w", err)
			}
		}
	}
	if first != nil && errors.Is(first, s.o.Errors.Busy) {
		// Still registered somewhere: keep the range so a later call retries (a device that
		// let go answers ErrNotRegistered then, which is fine).
		s.mu.Lock()
		s.regions = append(s.regions, buf)
		s.mu.Unlock()
	}
	return first
}

// regionIndex finds the registered range equal to buf, or -1.
func regionIndex(regions [][]byte, buf []byte) int {
	for i, r := range regions {
		if &r[0] == &buf[0] && len(r) == len(buf) {
			return i
		}
	}
	return -1
}

// device returns the set's opened device for rail ("" = Options.Device), opening it (and
// registering the pools on it) for its first connection.
func (s *Set) device(prov verbs.Provider, rail string) (*onesided.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.o.Errors.Closed
	}
	if d := s.devs[rail]; d != nil {
		return d, nil
	}
	name := rail
	if name == "" {
		name = s.o.Device
	}
	dev, err := onesided.OpenDevice(prov, name, &s.m)
	if err != nil {
		return nil, err
	}
	for _, b := range s.regions {
		if err := dev.RegisterMemory(b); err != nil {
			dev.Release()
			return nil, fmt.Errorf("register memory: %w", err)
		}
	}
	s.registerDMABufs(name, dev)
	if s.devs == nil {
		s.devs = map[string]*onesided.Device{}
	}
	s.devs[rail] = dev
	return dev, nil
}

func (s *Set) depth() uint32 {
	if d := s.o.Depth; d > 0 {
		return d
	}
	return 4
}

// MaxBlock is the largest value the set's connections carry (larger ones go over TCP).
func (s *Set) MaxBlock() uint64 {
	b := s.o.MaxBlock
	if b == 0 {
		b = 4 << 20
	}
	return min(b, s.o.MaxValue)
}
