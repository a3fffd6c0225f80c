package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Sentinel errors callers branch on.
var (
	// ErrCapacity: the hub's completion entries or registered-buffer budget cannot take
	// another endpoint.
	ErrCapacity = errors.New("notify: capacity exhausted")
	// ErrBackpressure: no credit or send buffer came free within the bounded wait.
	ErrBackpressure = errors.New("notify: backpressure: peer not keeping up")
	// ErrTooLarge: the notification is larger than this endpoint or its peer accepts.
	ErrTooLarge = errors.New("notify: notification too large")
	// ErrUnsupported: the peer has no native notifications and no fallback is allowed.
	ErrUnsupported = errors.New("notify: peer has no native notifications")
	// ErrBroken: the notification QP failed; sends in flight may or may not have arrived
	// and are not replayed.
	ErrBroken = errors.New("notify: endpoint broken")
	// ErrClosed: the endpoint or hub was torn down.
	ErrClosed = errors.New("notify: endpoint closed")
	// ErrNotConnected: the endpoint has no connected QP (before Connect, after Restart).
	ErrNotConnected = errors.New("notify: endpoint not connected")
	// ErrInvalid: a bad argument (name length, configuration).
	ErrInvalid = errors.New("notify: invalid argument")
)

// HubConfig bounds one device context's notification resources.
type HubConfig struct {
	// Port is the device port notification QPs are connected through.
	Port verbs.PortInfo
	// InitialCQEntries sizes the first shared CQ (default 1024); later CQs double.
	InitialCQEntries int
	// MaxCQEntries bounds the entries of all the hub's CQs together (default 65536).
	MaxCQEntries int
	// MaxBufferBytes bounds the registered notification buffers of all endpoints
	// (default 256 MiB).
	MaxBufferBytes int64
	// MaxIdle is how many released endpoints are kept (buffers registered, a fresh QP made
	// on reuse); default 16.
	MaxIdle int
	Metrics *Metrics
	Logger  *slog.Logger
}

func (c *HubConfig) defaults() {
	if c.InitialCQEntries <= 0 {
		c.InitialCQEntries = 1024
	}
	if c.MaxCQEntries <= 0 {
		c.MaxCQEntries = 1 << 16
	}
	if c.MaxBufferBytes <= 0 {
		c.MaxBufferBytes = 256 << 20
	}
	if c.MaxIdle == 0 {
		c.MaxIdle = 16
	}
	if c.Metrics == nil {
		c.Metrics = new(Metrics)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Hub is one device context's shared notification CQs and endpoints.
type Hub struct {
	cfg  HubConfig
	M    *Metrics
	vctx verbs.Context
	pd   verbs.PD

	pctx   context.Context // pollers
	cancel context.CancelFunc
	wg     sync.WaitGroup
	gate   atomic.Pointer[chan struct{}] // test hook: while set, pollers wait before polling

	mu       sync.Mutex
	cqs      []*hubCQ
	eps      map[uint32]*Endpoint
	idle     []*Endpoint
	nextID   uint32
	freeIDs  []freeID // ids of closed endpoints whose teardown drained, with their next generation
	bufBytes int64
	closed   bool
}

type freeID struct {
	id  uint32
	gen uint16
}

// hubCQ is one shared CQ and the entries endpoints reserved on it.
type hubCQ struct {
	cq       verbs.CQ
	entries  int
	reserved int
}

// NewHub makes the notification side of an opened device (context and PD); CQs are made as
// endpoints need them.
func NewHub(vctx verbs.Context, pd verbs.PD, cfg HubConfig) *Hub {
	cfg.defaults()
	pctx, cancel := context.WithCancel(context.Background())
	return &Hub{cfg: cfg, M: cfg.Metrics, vctx: vctx, pd: pd, pctx: pctx, cancel: cancel, eps: map[uint32]*Endpoint{}}
}

// CQs returns how many shared CQs the hub has, and their entries together.
func (h *Hub) CQs() (n, entries int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.cqs {
		entries += c.entries
	}
	return len(h.cqs), entries
}

// reserve finds room for need entries on a CQ, adding a larger one when none has room.
// The caller holds h.mu.
func (h *Hub) reserveLocked(need int) (*hubCQ, error) {
	total := 0
	for _, c := range h.cqs {
		if c.entries-c.reserved >= need {
			c.reserved += need
			return c, nil
		}
		total += c.entries
	}
	size := h.cfg.InitialCQEntries
	if n := len(h.cqs); n > 0 {
		size = 2 * h.cqs[n-1].entries
	}
	size = max(size, need)
	if m := h.vctx.Info().MaxCQE; m > 0 {
		size = min(size, m)
	}
	size = min(size, h.cfg.MaxCQEntries-total)
	if size < need {
		return nil, fmt.Errorf("%w: %d completion entries needed, %d of %d in use", ErrCapacity, need, total, h.cfg.MaxCQEntries)
	}
	cq, err := h.vctx.CreateCQ(size)
	if err != nil {
		return nil, fmt.Errorf("notify: create shared CQ of %d: %w", size, err)
	}
	c := &hubCQ{cq: cq, entries: size, reserved: need}
	if len(h.cqs) > 0 {
		h.M.CQGrowths.Add(1)
	}
	h.cqs = append(h.cqs, c)
	h.M.CQEntries.Add(int64(size))
	h.wg.Add(1)
	go h.poll(c)
	return c, nil
}

// poll drains one shared CQ and routes its completions until the hub closes.
func (h *Hub) poll(c *hubCQ) {
	defer h.wg.Done()
	var wcs [32]verbs.WorkCompletion
	for {
		if !h.passGate() {
			return
		}
		n, err := c.cq.Poll(wcs[:])
		if err != nil {
			if h.pctx.Err() == nil {
				// Overflow (or a destroyed CQ) is fatal for every endpoint on this CQ.
				h.cfg.Logger.Error("notify: shared CQ failed", "err", err)
				h.failCQ(c, err)
			}
			return
		}
		// A gate set between the look above and the poll holds what was polled, unrouted,
		// like the completions still in the CQ.
		if n > 0 && !h.passGate() {
			return
		}
		for _, wc := range wcs[:n] {
			h.route(wc)
		}
		if n > 0 {
			continue
		}
		if err := c.cq.Wait(h.pctx); err != nil && h.pctx.Err() != nil {
			return
		}
	}
}

// passGate waits while the test hook's gate is set; false when the hub closed meanwhile.
func (h *Hub) passGate() bool {
	g := h.gate.Load()
	if g == nil {
		return true
	}
	select {
	case <-*g:
		return true
	case <-h.pctx.Done():
		return false
	}
}

// wr_id layout: endpoint id (24 bits) | generation (16 bits) | receive flag | index (23 bits).
const (
	idShift  = 40
	genShift = 24
	recvFlag = 1 << 23
	idxMask  = recvFlag - 1
	genMask  = 1<<16 - 1
	maxID    = 1<<24 - 1
)

func wrID(id uint32, gen uint16, recv bool, idx int) uint64 {
	w := uint64(id)<<idShift | uint64(gen)<<genShift | uint64(idx)&idxMask
	if recv {
		w |= recvFlag
	}
	return w
}

func splitID(w uint64) (id uint32, gen uint16, recv bool, idx int) {
	return uint32(w >> idShift), uint16(w >> genShift & genMask), w&recvFlag != 0, int(w & idxMask)
}

// route hands a completion to its endpoint when the generation it was posted in is still
// current; anything else is dropped (and counted), never delivered to a newer QP.
func (h *Hub) route(wc verbs.WorkCompletion) {
	id, gen, recv, idx := splitID(wc.ID)
	h.mu.Lock()
	ep := h.eps[id]
	h.mu.Unlock()
	if ep == nil || !ep.complete(gen, recv, idx, wc) {
		h.M.Drops.Add(1)
	}
}

func (h *Hub) failCQ(c *hubCQ, err error) {
	h.mu.Lock()
	var eps []*Endpoint
	for _, ep := range h.eps {
		if ep.cq == c {
			eps = append(eps, ep)
		}
	}
	h.mu.Unlock()
	for _, ep := range eps {
		ep.fail(fmt.Errorf("shared CQ: %w", err))
	}
}

// Close tears down every endpoint (in-flight sends are flushed and not replayed), stops
// the pollers and destroys the CQs. The context and PD stay the caller's.
func (h *Hub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	var eps []*Endpoint
	for _, ep := range h.eps {
		eps = append(eps, ep)
	}
	h.idle = nil
	h.mu.Unlock()
	for _, ep := range eps {
		ep.Close()
	}
	h.cancel()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.cqs {
		c.cq.Close()
		h.M.CQEntries.Add(-int64(c.entries))
	}
	h.cqs = nil
	return nil
}
