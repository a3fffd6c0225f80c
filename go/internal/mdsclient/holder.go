package mdsclient

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// HolderConfig describes one registration to keep alive. Exactly one of Member and Client
// is set.
type HolderConfig struct {
	Client *Client
	Group  string
	Member *wire.Member     // a cache node (enters the ring)
	Info   *wire.ClientInfo // a cache consumer (clients prefix, never the ring)
	// Heartbeat is the interval between heartbeats; 0 = a third of the lease TTL the MDS
	// reports (1s until the first registration answers).
	Heartbeat time.Duration
	Logger    *slog.Logger
	// OnError is called after every failed call (metrics); may be nil.
	OnError func(error)
}

// Holder registers once and heartbeats until Stop. Registration retries until it succeeds;
// a heartbeat answered NotFound (the lease expired, e.g. after a long pause) registers
// again; any other failure is retried at the next tick (the Client has already tried
// every replica).
type Holder struct {
	cfg        HolderConfig
	ops        [3]fb.MdsOp // register, heartbeat, deregister
	registered atomic.Bool
	// cutShort: Stop interrupted a registration in flight, which the MDS may still have
	// applied; Stop deregisters then too.
	cutShort  atomic.Bool
	ttl       atomic.Int64 // ns, from the last registration
	stop      chan struct{}
	done      chan struct{}
	ctx       context.Context // ends on Stop: interrupts a register or heartbeat in flight
	cancel    context.CancelFunc
	first     chan struct{}
	firstOnce sync.Once
	stopOnce  sync.Once

	mu     sync.Mutex   // guards member (UpdateMember replaces it)
	member *wire.Member // the record heartbeats carry; cfg.Member until updated
	kick   chan struct{}
}

// ErrBadHolder: the configuration names neither or both of Member and Info.
var ErrBadHolder = errors.New("mds: holder needs exactly one of Member and Info")

// NewHolder validates cfg; Start begins the loop.
func NewHolder(cfg HolderConfig) (*Holder, error) {
	if cfg.Client == nil || (cfg.Member == nil) == (cfg.Info == nil) {
		return nil, ErrBadHolder
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Holder{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}), first: make(chan struct{}),
		member: cfg.Member, kick: make(chan struct{}, 1)}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if cfg.Member != nil {
		h.ops = [3]fb.MdsOp{fb.MdsOpRegisterMember, fb.MdsOpHeartbeatMember, fb.MdsOpDeregisterMember}
	} else {
		h.ops = [3]fb.MdsOp{fb.MdsOpRegisterClient, fb.MdsOpHeartbeatClient, fb.MdsOpDeregisterClient}
	}
	return h, nil
}

// Start runs the register/heartbeat loop in the background.
func (h *Holder) Start() { go h.loop() }

// Registered reports whether the holder is currently registered (the last call succeeded).
func (h *Holder) Registered() bool { return h.registered.Load() }

// FirstRegistered is closed once the first registration succeeded.
func (h *Holder) FirstRegistered() <-chan struct{} { return h.first }

func (h *Holder) request(op fb.MdsOp) *wire.MdsRequest {
	h.mu.Lock()
	m := h.member
	h.mu.Unlock()
	return &wire.MdsRequest{Op: op, Group: h.cfg.Group, Member: m, Client: h.cfg.Info}
}

// UpdateMember replaces the member record (same id) and sends it at once: the next
// heartbeat, run now, rewrites the record under its lease (or registers again when the
// lease is gone). For a holder of a client registration it is an error.
func (h *Holder) UpdateMember(m *wire.Member) error {
	if h.cfg.Member == nil || m == nil || m.ID != h.cfg.Member.ID {
		return errors.New("mds: UpdateMember needs a member holder and the same member id")
	}
	c := *m
	h.mu.Lock()
	h.member = &c
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default: // a send is already due
	}
	return nil
}

func (h *Holder) name() string {
	if h.cfg.Member != nil {
		return "member " + h.cfg.Member.ID
	}
	return "client " + h.cfg.Info.ID
}

func (h *Holder) interval() time.Duration {
	if h.cfg.Heartbeat > 0 {
		return h.cfg.Heartbeat
	}
	if ttl := time.Duration(h.ttl.Load()); ttl > 0 {
		return max(ttl/3, 50*time.Millisecond)
	}
	return time.Second
}

func (h *Holder) call(op fb.MdsOp) (*wire.MdsResponse, error) {
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.Client.opts.CallTimeout*time.Duration(len(h.cfg.Client.eps)+1))
	defer cancel()
	resp, _, err := h.cfg.Client.Call(ctx, h.request(op))
	if err != nil && h.cfg.OnError != nil {
		h.cfg.OnError(err)
	}
	return resp, err
}

func (h *Holder) register() bool {
	resp, err := h.call(h.ops[0])
	if err != nil {
		h.registered.Store(false)
		if h.ctx.Err() != nil {
			h.cutShort.Store(true)
			return false // stopping
		}
		h.cfg.Logger.Warn("mds registration failed; retrying", "who", h.name(), "err", err)
		return false
	}
	if resp.LeaseTTLMS > 0 {
		h.ttl.Store(int64(time.Duration(resp.LeaseTTLMS) * time.Millisecond))
	}
	wasRegistered := h.registered.Swap(true)
	h.firstOnce.Do(func() {
		close(h.first)
		h.cfg.Logger.Info("registered with mds", "who", h.name(), "group", h.cfg.Group, "lease_ttl_ms", resp.LeaseTTLMS)
	})
	if !wasRegistered {
		h.cfg.Logger.Debug("mds registration", "who", h.name())
	}
	return true
}

func (h *Holder) loop() {
	defer close(h.done)
	registered := h.register()
	for {
		wait := h.interval()
		if !registered {
			wait = min(wait, time.Second)
		}
		t := time.NewTimer(wait)
		select {
		case <-h.stop:
			t.Stop()
			return
		case <-t.C:
		case <-h.kick:
			t.Stop()
		}
		if !registered {
			registered = h.register()
			continue
		}
		_, err := h.call(h.ops[1])
		switch {
		case err == nil:
			h.registered.Store(true)
		case errors.Is(err, ErrNotRegistered):
			h.cfg.Logger.Warn("mds forgot this registration (lease expired); registering again", "who", h.name())
			h.registered.Store(false)
			registered = h.register()
		default:
			// Keep "registered": the lease may well still be alive; the next tick retries.
			h.cfg.Logger.Warn("mds heartbeat failed", "who", h.name(), "err", err)
		}
	}
}

// cutShortDeregister bounds Stop's deregistration after a registration it cut short.
const cutShortDeregister = time.Second

// Stop ends the loop and deregisters (bounded by ctx), so the holder leaves at once rather
// than after the lease TTL.
func (h *Holder) Stop(ctx context.Context) error {
	var err error
	h.stopOnce.Do(func() {
		close(h.stop)
		h.cancel() // a heartbeat stuck on a stalled replica must not hold the deregistration
		select {
		case <-h.done:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
		registered := h.registered.Load()
		if !registered && !h.cutShort.Load() {
			return
		}
		if !registered {
			// The registration may not have landed and the MDS was slow to answer it: try
			// once, briefly, and otherwise leave it to the lease, rather than hold a
			// shutdown for the whole deadline on an MDS that is not answering.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cutShortDeregister)
			defer cancel()
		}
		_, _, err = h.cfg.Client.Call(ctx, h.request(h.ops[2]))
		if errors.Is(err, ErrNotRegistered) {
			err = nil // the cut-short registration never landed, or its lease ended
		}
		h.registered.Store(false)
	})
	return err
}
