package onesided

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// sharedSegment is the one receive segment of a RailServer: allocated once, leased by
// every rail, registered on each rail's PD (the seed's "registered on each selected rail").
type sharedSegment struct {
	buf *verbs.Buffer
	seg *segment
}

// RailServer serves RDMA on several devices (rails) of one provider: one Server per rail
// (device context, PD, RAM tier arena registration, connections), one receive segment for
// all. A connection is served on the rail its offer names (the client's device) when this
// server has that rail and it is healthy, else on the first healthy rail in order, so a
// client whose rail is down here still gets RDMA through another one.
type RailServer struct {
	pref    []string // every configured rail, in preference order
	engine  store.Engine
	shared  *sharedSegment
	limits  dcp.Limits
	cfg     Config
	healthy atomic.Pointer[func(device string) bool]

	addMu   sync.Mutex // serializes AddRail and Close (a rail opening while the segment is freed)
	mu      sync.RWMutex
	order   []string // rails served, in preference order
	servers map[string]*Server
	closed  bool
}

// NewRailServer opens a Server on each device in devices (preference order). A device that
// cannot serve (missing, no ACTIVE port) is skipped and reported in skipped; at least one
// must open.
func NewRailServer(cfg Config, engine store.Engine, devices []string) (r *RailServer, skipped map[string]error, err error) {
	if len(devices) == 0 {
		return nil, nil, errors.New("onesided: no rails")
	}
	cfg.defaults()
	buf, err := verbs.AllocBuffer(int(cfg.SegmentBytes))
	if err != nil {
		return nil, nil, err
	}
	r = &RailServer{servers: map[string]*Server{}, shared: &sharedSegment{buf: buf, seg: newSegment(cfg.SegmentBytes)},
		limits: cfg.limits(), cfg: cfg, pref: append([]string(nil), devices...), engine: engine}
	skipped = map[string]error{}
	for _, d := range devices {
		c := cfg
		c.Device, c.shared = d, r.shared
		s, err := NewServer(c, engine)
		if err != nil {
			skipped[d] = err
			continue
		}
		r.order = append(r.order, d)
		r.servers[d] = s
	}
	if len(r.order) == 0 {
		buf.Free()
		var errs []error
		for _, d := range devices {
			errs = append(errs, fmt.Errorf("%s: %w", d, skipped[d]))
		}
		return nil, skipped, fmt.Errorf("onesided: no rail can serve: %w", errors.Join(errs...))
	}
	return r, skipped, nil
}

// SetHealth installs the rail health the choice follows (nil: every served rail is
// healthy). Safe to call while serving.
func (r *RailServer) SetHealth(healthy func(device string) bool) {
	if healthy == nil {
		r.healthy.Store(nil)
		return
	}
	r.healthy.Store(&healthy)
}

func (r *RailServer) isHealthy(d string) bool {
	h := r.healthy.Load()
	return h == nil || (*h)(d)
}

// AddRail starts serving a configured rail that could not serve at start (its port came
// up since). A rail already served is a no-op.
func (r *RailServer) AddRail(dev string) error {
	r.addMu.Lock()
	defer r.addMu.Unlock()
	r.mu.RLock()
	_, have := r.servers[dev]
	closed := r.closed
	r.mu.RUnlock()
	if have {
		return nil
	}
	if closed {
		return errors.New("onesided: rail server closed")
	}
	known := false
	for _, d := range r.pref {
		known = known || d == dev
	}
	if !known {
		return fmt.Errorf("onesided: %q is not a configured rail", dev)
	}
	c := r.cfg
	c.Device, c.shared = dev, r.shared
	s, err := NewServer(c, r.engine)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servers[dev] = s
	r.order = r.order[:0:0]
	for _, d := range r.pref {
		if r.servers[d] != nil {
			r.order = append(r.order, d)
		}
	}
	return nil
}

// Devices lists the rails served, in preference order.
func (r *RailServer) Devices() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]string(nil), r.order...)
}

// Device is the preferred rail served (the one a connection naming no served rail gets
// when it is healthy).
func (r *RailServer) Device() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.order[0]
}

// choose picks the rail for an offer naming want.
func (r *RailServer) choose(want string) *Server {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if s, ok := r.servers[want]; ok && r.isHealthy(want) {
		return s
	}
	for _, d := range r.order {
		if r.isHealthy(d) {
			return r.servers[d]
		}
	}
	return r.servers[r.order[0]] // nothing healthy: the preferred rail answers (or fails) as it can
}

// Serve reads the offer, picks the rail and serves the connection there (Server.Serve).
func (r *RailServer) Serve(ctx context.Context, boot net.Conn) error {
	kind, body, err := readFrame(boot, r.cfg.IOTimeout)
	if err != nil {
		return fmt.Errorf("onesided: read offer: %w", err)
	}
	want := ""
	if kind == frameTail {
		// A bad offer goes to the preferred rail, which refuses it with the reason.
		if offer, err := dcp.DecodeOffer(body, r.limits); err == nil && len(offer.Rails) > 0 {
			want = offer.Rails[0].Device
		}
	}
	s := r.choose(want)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("onesided: server closed")
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return s.serveTail(ctx, boot, kind, body)
}

// served returns the rails' servers in preference order.
func (r *RailServer) served() ([]string, []*Server) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ss := make([]*Server, len(r.order))
	for i, d := range r.order {
		ss[i] = r.servers[d]
	}
	return append([]string(nil), r.order...), ss
}

// Stats sums the rails' metrics (the segment gauges once: it is shared).
func (r *RailServer) Stats() map[string]float64 {
	out := map[string]float64{}
	_, ss := r.served()
	for _, srv := range ss {
		for k, v := range srv.Stats() {
			if strings.HasPrefix(k, "dfkv_rdma_recv_segment_") {
				out[k] = v
				continue
			}
			out[k] += v
		}
	}
	return out
}

// RailStats returns each served rail's own metrics.
func (r *RailServer) RailStats() map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	names, ss := r.served()
	for i, srv := range ss {
		out[names[i]] = srv.Stats()
	}
	return out
}

// Close closes every rail, then frees the shared segment.
func (r *RailServer) Close() error {
	r.addMu.Lock()
	defer r.addMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	_, ss := r.served()
	var errs []error
	for _, srv := range ss {
		errs = append(errs, srv.Close())
	}
	r.shared.buf.Free()
	return errors.Join(errs...)
}

// Device is the name of the device this server serves on.
func (s *Server) Device() string { return s.ctx.Info().Name }
