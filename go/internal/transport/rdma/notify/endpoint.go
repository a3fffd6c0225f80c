package notify

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// Handler receives a notification. It runs on the hub's poller: it must not block and must
// not call Send (credits come back through the same poller); body is valid only during the
// call.
type Handler func(name string, body []byte)

// Config shapes one endpoint.
type Config struct {
	// Credits: notifications the peer may have in flight to this endpoint (receive
	// buffers posted for messages; two more are kept for credit returns). Default 16.
	Credits int
	// SendDepth: notifications this endpoint may have in flight (send buffers). Default 16.
	SendDepth int
	// MaxMsg: the largest notification (name + body) taken or sent. Default 65528 (a 64 KiB
	// buffer with its header).
	MaxMsg int
	// SendTimeout bounds a Send's wait for a credit or send buffer. Default 5 s.
	SendTimeout time.Duration
	// TeardownTimeout bounds the wait for a torn-down QP's flushed completions. Default 2 s.
	TeardownTimeout time.Duration
	Handler         Handler
}

func (c *Config) defaults() error {
	if c.Credits == 0 {
		c.Credits = 16
	}
	if c.SendDepth == 0 {
		c.SendDepth = 16
	}
	if c.MaxMsg == 0 {
		c.MaxMsg = 64<<10 - HeaderSize
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = 5 * time.Second
	}
	if c.TeardownTimeout <= 0 {
		c.TeardownTimeout = 2 * time.Second
	}
	switch {
	case c.Credits < 1 || c.Credits > dcp.MaxNotifyCredits:
		return fmt.Errorf("%w: %d credits (1..%d)", ErrInvalid, c.Credits, dcp.MaxNotifyCredits)
	case c.SendDepth < 1 || c.SendDepth > 4096:
		return fmt.Errorf("%w: send depth %d (1..4096)", ErrInvalid, c.SendDepth)
	case c.MaxMsg < MaxName+1 || c.MaxMsg > dcp.MaxNotifyMsg:
		return fmt.Errorf("%w: max message %d (%d..%d)", ErrInvalid, c.MaxMsg, MaxName+1, dcp.MaxNotifyMsg)
	}
	return nil
}

// reserve: receive buffers kept for credit returns and send buffers for sending them. Credit
// messages go out only when half of the credits are unreported, so at most two are ever in
// flight towards one peer.
const reserve = 2

type epState uint8

const (
	stateIdle epState = iota // a QP in RESET: Info is valid, Connect next
	stateConnected
	stateBroken
	stateTearing
	stateClosed
)

// Endpoint is one notification QP with its registered buffers.
type Endpoint struct {
	h     *Hub
	cfg   Config
	id    uint32
	cq    *hubCQ
	need  int // CQ entries reserved
	bufSz int
	buf   *verbs.Buffer // receive buffers (Credits+reserve), then send buffers (SendDepth+reserve)
	mr    verbs.MR

	mu         sync.Mutex
	wake       chan struct{} // closed and replaced when credits, buffers or the state change
	gen        uint16
	qp         verbs.QP
	psn        uint32
	state      epState
	err        error
	credits    int // messages the peer can still take
	peerMax    int
	unreported int // messages received and reposted, credits not yet returned
	freeSend   []int
	freeCredit []int
	inflight   int  // send WRs not yet completed
	posted     int  // receive WRs not yet completed
	dirty      bool // a teardown timed out: completions of this id may still arrive
}

func (e *Endpoint) nRecv() int { return e.cfg.Credits + reserve }

// Acquire returns an endpoint ready for Info and Connect: a released one of the same shape
// (its registered buffers kept, a fresh QP and generation), else a new one when the hub's
// capacity allows (ErrCapacity otherwise).
func (h *Hub) Acquire(cfg Config) (*Endpoint, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	for i, e := range h.idle {
		if e.cfg.Credits == cfg.Credits && e.cfg.SendDepth == cfg.SendDepth && e.cfg.MaxMsg == cfg.MaxMsg {
			h.idle = append(h.idle[:i], h.idle[i+1:]...)
			h.mu.Unlock()
			e.mu.Lock()
			e.cfg = cfg
			e.mu.Unlock()
			if err := e.newQP(); err != nil {
				e.Close()
				return nil, err
			}
			h.M.EndpointReuses.Add(1)
			return e, nil
		}
	}
	e := &Endpoint{h: h, cfg: cfg, bufSz: HeaderSize + cfg.MaxMsg, wake: make(chan struct{})}
	e.need = cfg.Credits + cfg.SendDepth + 2*reserve
	bytes := int64(e.bufSz) * int64(cfg.Credits+cfg.SendDepth+2*reserve)
	if h.bufBytes+bytes > h.cfg.MaxBufferBytes {
		h.mu.Unlock()
		h.M.CapacityFailures.Add(1)
		return nil, fmt.Errorf("%w: %d buffer bytes needed, %d of %d registered", ErrCapacity, bytes, h.bufBytes, h.cfg.MaxBufferBytes)
	}
	if h.nextID >= maxID && len(h.freeIDs) == 0 {
		h.mu.Unlock()
		h.M.CapacityFailures.Add(1)
		return nil, fmt.Errorf("%w: endpoint ids used up", ErrCapacity)
	}
	c, err := h.reserveLocked(e.need)
	if err != nil {
		h.mu.Unlock()
		if errors.Is(err, ErrCapacity) {
			h.M.CapacityFailures.Add(1)
		}
		return nil, err
	}
	if n := len(h.freeIDs); n > 0 {
		// A closed endpoint's id, in the generation after its last: nothing of it can
		// still be on a CQ (its teardown drained), and a late completion would not match.
		f := h.freeIDs[n-1]
		h.freeIDs = h.freeIDs[:n-1]
		e.id, e.gen = f.id, f.gen
	} else {
		h.nextID++
		e.id = h.nextID
	}
	e.cq = c
	h.bufBytes += bytes
	h.eps[e.id] = e
	h.mu.Unlock()
	h.M.Endpoints.Add(1)
	h.M.BufferBytes.Add(bytes)
	if e.buf, err = verbs.AllocBuffer(int(bytes)); err != nil {
		e.Close()
		return nil, err
	}
	if e.mr, err = h.pd.RegMR(e.buf.Bytes(), verbs.AccessLocalWrite); err != nil {
		e.Close()
		return nil, fmt.Errorf("notify: register %d buffer bytes: %w", bytes, err)
	}
	if err := e.newQP(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// newQP makes the endpoint's QP for its current generation (state idle).
func (e *Endpoint) newQP() error {
	qp, err := e.h.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: e.cq.cq, RecvCQ: e.cq.cq,
		MaxSendWR: e.cfg.SendDepth + reserve, MaxRecvWR: e.nRecv(), MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fmt.Errorf("notify: create QP: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.qp, e.psn, e.state, e.err = qp, rand.Uint32()&0xffffff, stateIdle, nil
	e.credits, e.peerMax, e.unreported, e.inflight, e.posted = 0, 0, 0, 0, 0
	e.freeSend, e.freeCredit = e.freeSend[:0], e.freeCredit[:0]
	for i := range e.cfg.SendDepth {
		e.freeSend = append(e.freeSend, e.nRecv()+i)
	}
	for i := range reserve {
		e.freeCredit = append(e.freeCredit, e.nRecv()+e.cfg.SendDepth+i)
	}
	e.signalLocked()
	return nil
}

// Generation is the endpoint's current QP generation.
func (e *Endpoint) Generation() uint16 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// ID is the endpoint's id on its hub (kept across Release and Restart).
func (e *Endpoint) ID() uint32 { return e.id }

// Info is what the peer needs to connect to this endpoint's current QP (sent in the DCP tail).
func (e *Endpoint) Info() dcp.Notify {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := dcp.Notify{PSN: e.psn, RecvCredits: uint32(e.cfg.Credits), MaxMsg: uint32(e.cfg.MaxMsg)}
	if e.qp != nil {
		n.QPNum = e.qp.Num()
	}
	return n
}

// Connect posts the receive buffers and connects the QP to the peer's notification QP
// (remote) on the peer's rail (its GID, LID and MTU); path is the local source GID index,
// hop limit and traffic class, those of the connection's data QP (its rail's GID is the one
// the peer was told).
func (e *Endpoint) Connect(remote dcp.Notify, rail dcp.Rail, path verbs.Path) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != stateIdle {
		return fmt.Errorf("notify: connect in state %d: %w", e.state, ErrNotConnected)
	}
	if remote.RecvCredits == 0 || remote.MaxMsg == 0 {
		return fmt.Errorf("%w: peer offers %d credits, %d-byte messages", ErrInvalid, remote.RecvCredits, remote.MaxMsg)
	}
	port := e.h.cfg.Port
	local := verbs.Endpoint{QPNum: e.qp.Num(), PSN: e.psn, GID: port.GID, LID: port.LID, Port: port.Num, MTU: port.MTU}
	peer := rail.Endpoint()
	peer.QPNum, peer.PSN = remote.QPNum, remote.PSN
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPInit, PortNum: port.Num, Access: verbs.AccessLocalWrite}); err != nil {
		return fmt.Errorf("notify: qp init: %w", err)
	}
	recvs := make([]verbs.RecvWR, e.nRecv())
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: wrID(e.id, e.gen, true, i), SGL: []verbs.SGE{verbs.SGEOf(e.mr, i*e.bufSz, e.bufSz)}}
	}
	if _, err := e.qp.PostRecv(recvs); err != nil {
		return fmt.Errorf("notify: post receives: %w", err)
	}
	e.posted = len(recvs)
	steps := []verbs.QPAttr{
		{State: verbs.QPRTR, PathMTU: min(local.MTU, peer.MTU), DestQPNum: peer.QPNum, RQPSN: peer.PSN,
			RemoteGID: peer.GID, RemoteLID: peer.LID, PortNum: port.Num, Path: path},
		{State: verbs.QPRTS, SQPSN: local.PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7},
	}
	for _, a := range steps {
		if err := e.qp.Modify(a); err != nil {
			return fmt.Errorf("notify: connect qp %d to %d: %w", local.QPNum, peer.QPNum, err)
		}
	}
	e.credits, e.peerMax, e.state = int(remote.RecvCredits), int(remote.MaxMsg), stateConnected
	e.signalLocked()
	return nil
}

func (e *Endpoint) signalLocked() {
	close(e.wake)
	e.wake = make(chan struct{})
}

// MaxSend is the largest notification (name + body) Send takes now: the smaller of this
// endpoint's and the peer's limits (0 before Connect).
func (e *Endpoint) MaxSend() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return min(e.cfg.MaxMsg, e.peerMax)
}

// Send submits one notification. It waits (bounded by ctx and SendTimeout) for a credit and
// a send buffer, else ErrBackpressure. nil means the SEND was posted, not that the peer has
// it. A notification larger than either side accepts is ErrTooLarge and nothing is sent.
func (e *Endpoint) Send(ctx context.Context, name string, body []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	e.mu.Lock()
	if e.state == stateConnected && len(name)+len(body) > min(e.cfg.MaxMsg, e.peerMax) {
		e.mu.Unlock()
		return fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, len(name)+len(body), min(e.cfg.MaxMsg, e.peerMax))
	}
	var cancel context.CancelFunc = func() {}
	waited := false
	for {
		switch e.state {
		case stateConnected:
		case stateBroken:
			err := e.err
			e.mu.Unlock()
			cancel()
			return err
		case stateIdle:
			e.mu.Unlock()
			cancel()
			return ErrNotConnected
		default:
			e.mu.Unlock()
			cancel()
			return ErrClosed
		}
		if e.credits > 0 && len(e.freeSend) > 0 {
			break
		}
		if !waited {
			waited = true
			e.h.M.BackpressureWaits.Add(1)
			ctx, cancel = context.WithTimeout(ctx, e.cfg.SendTimeout)
		}
		w := e.wake
		e.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			cancel()
			e.h.M.BackpressureTimeouts.Add(1)
			return fmt.Errorf("%w: no credit or send buffer within the wait: %w", ErrBackpressure, ctx.Err())
		}
		e.mu.Lock()
	}
	defer cancel()
	idx := e.freeSend[len(e.freeSend)-1]
	e.freeSend = e.freeSend[:len(e.freeSend)-1]
	ret := min(e.unreported, 1<<16-1)
	n := encode(e.buf.Bytes()[idx*e.bufSz:], kindMsg, uint16(ret), name, body)
	err := e.postLocked(idx, n)
	if err != nil {
		e.freeSend = append(e.freeSend, idx)
		e.mu.Unlock()
		e.h.M.SendErrors.Add(1)
		return err
	}
	e.unreported -= ret
	e.credits--
	e.mu.Unlock()
	e.h.M.Sends.Add(1)
	return nil
}

// postLocked posts one SEND of buffer idx (n bytes).
func (e *Endpoint) postLocked(idx, n int) error {
	wr := verbs.SendWR{ID: wrID(e.id, e.gen, false, idx), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEOf(e.mr, idx*e.bufSz, n)}}
	if _, err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		// Nothing was queued (verbs contract), but a QP that refuses a post is not usable.
		e.failLocked(fmt.Errorf("post send: %w", err))
		return e.err
	}
	e.inflight++
	return nil
}

// flushCreditsLocked returns credits in a credit message once half of them are unreported.
func (e *Endpoint) flushCreditsLocked() {
	if e.state != stateConnected || e.unreported < (e.cfg.Credits+1)/2 || len(e.freeCredit) == 0 {
		return
	}
	idx := e.freeCredit[len(e.freeCredit)-1]
	e.freeCredit = e.freeCredit[:len(e.freeCredit)-1]
	ret := min(e.unreported, 1<<16-1)
	n := encode(e.buf.Bytes()[idx*e.bufSz:], kindCredit, uint16(ret), "", nil)
	if e.postLocked(idx, n) != nil {
		return
	}
	e.unreported -= ret
	e.h.M.CreditMsgs.Add(1)
}

func (e *Endpoint) failLocked(err error) {
	if e.state != stateConnected {
		return
	}
	e.state, e.err = stateBroken, fmt.Errorf("%w: %w", ErrBroken, err)
	e.signalLocked()
}

func (e *Endpoint) fail(err error) {
	e.mu.Lock()
	e.failLocked(err)
	e.mu.Unlock()
}

// complete handles one routed completion; false when it belongs to an older generation.
func (e *Endpoint) complete(gen uint16, recv bool, idx int, wc verbs.WorkCompletion) bool {
	e.mu.Lock()
	if gen != e.gen || e.state == stateClosed {
		e.mu.Unlock()
		return false
	}
	if !recv {
		e.inflight--
		if idx >= e.nRecv()+e.cfg.SendDepth {
			e.freeCredit = append(e.freeCredit, idx)
		} else {
			e.freeSend = append(e.freeSend, idx)
		}
		if wc.Status != verbs.StatusSuccess {
			// The sends still in flight are uncertain: not replayed.
			if e.state != stateTearing { // a teardown's flushes are expected
				e.h.M.SendErrors.Add(1)
			}
			e.failLocked(fmt.Errorf("send completion: %w", wc.Err()))
		} else {
			e.flushCreditsLocked()
		}
		e.signalLocked()
		e.mu.Unlock()
		return true
	}
	// posted drops only once the buffer is no longer read: teardown waits for it.
	done := func() {
		e.posted--
		e.signalLocked()
		e.mu.Unlock()
	}
	if wc.Status != verbs.StatusSuccess {
		e.failLocked(fmt.Errorf("receive completion: %w", wc.Err()))
		done()
		return true
	}
	b := e.buf.Bytes()[idx*e.bufSz : idx*e.bufSz+int(wc.ByteLen)]
	kind, credits, name, body, err := decode(b)
	if err == nil && kind == kindMsg && len(name)+len(body) > e.cfg.MaxMsg {
		err = fmt.Errorf("%w: %d bytes", ErrTooLarge, len(name)+len(body))
	}
	if err != nil {
		e.failLocked(fmt.Errorf("receive: %w", err))
		done()
		return true
	}
	e.credits += int(credits)
	e.signalLocked()
	h, state := e.cfg.Handler, e.state
	e.mu.Unlock()
	// Deliver before the buffer is reposted: body aliases it.
	if kind == kindMsg && state == stateConnected {
		e.h.M.Recvs.Add(1)
		if h != nil {
			h(string(name), body)
		}
	}
	e.mu.Lock()
	if e.gen != gen || e.state != stateConnected {
		done() // torn down meanwhile: the buffer goes back with the QP
		return true
	}
	rwr := verbs.RecvWR{ID: wrID(e.id, e.gen, true, idx), SGL: []verbs.SGE{verbs.SGEOf(e.mr, idx*e.bufSz, e.bufSz)}}
	if _, err := e.qp.PostRecv([]verbs.RecvWR{rwr}); err != nil {
		e.failLocked(fmt.Errorf("repost receive: %w", err))
		done()
		return true
	}
	if kind == kindMsg {
		e.unreported++
		e.flushCreditsLocked()
	}
	e.signalLocked()
	e.mu.Unlock()
	return true
}

// teardown moves the QP to ERR, waits (bounded) for its flushed completions, destroys it and
// moves to the next generation; what a timed-out wait leaves on the CQ stays reserved.
func (e *Endpoint) teardown(final epState) {
	e.mu.Lock()
	for e.state == stateTearing { // another teardown runs: wait for it, then go on from there
		w := e.wake
		e.mu.Unlock()
		<-w
		e.mu.Lock()
	}
	if e.state == stateClosed {
		e.mu.Unlock()
		return
	}
	qp := e.qp
	connected := e.state != stateIdle
	e.state = stateTearing
	e.signalLocked()
	e.mu.Unlock()
	if qp != nil && connected {
		qp.Modify(verbs.QPAttr{State: verbs.QPErr})
		deadline := time.NewTimer(e.cfg.TeardownTimeout)
		defer deadline.Stop()
		for {
			e.mu.Lock()
			left, w := e.inflight+e.posted, e.wake
			e.mu.Unlock()
			if left == 0 {
				break
			}
			select {
			case <-w:
				continue
			case <-deadline.C:
			}
			// Their completions may still come: keep their CQ entries reserved for good
			// (and the endpoint id out of reuse).
			e.mu.Lock()
			e.dirty = true
			e.mu.Unlock()
			e.h.mu.Lock()
			e.cq.reserved += left
			e.h.mu.Unlock()
			e.h.cfg.Logger.Warn("notify: torn-down QP left completions", "endpoint", e.id, "left", left)
			break
		}
	}
	if qp != nil {
		qp.Close()
	}
	e.mu.Lock()
	e.qp = nil
	e.gen = (e.gen + 1) & genMask
	e.state = final
	e.signalLocked()
	e.mu.Unlock()
}

// Restart tears the QP down (sends in flight are flushed, not replayed) and makes a fresh
// one in the next generation: completions of the old QP are dropped from then on. Info
// and Connect follow, as after Acquire.
func (e *Endpoint) Restart() error {
	e.teardown(stateIdle)
	e.mu.Lock()
	closed := e.state == stateClosed
	e.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return e.newQP()
}

// Release tears the QP down and keeps the endpoint (its registered buffers and CQ entries)
// on the hub's idle list for the next Acquire, or closes it when the list is full.
func (e *Endpoint) Release() {
	e.teardown(stateIdle)
	h := e.h
	h.mu.Lock()
	if !h.closed && len(h.idle) < h.cfg.MaxIdle && h.eps[e.id] == e {
		h.idle = append(h.idle, e)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	e.Close()
}

// Close tears the QP down and returns the endpoint's buffers and CQ entries to the hub.
func (e *Endpoint) Close() error {
	e.teardown(stateClosed)
	e.mu.Lock()
	if e.state != stateClosed { // a concurrent teardown finished into idle
		e.state = stateClosed
	}
	mr, buf, dirty, gen := e.mr, e.buf, e.dirty, e.gen
	e.mr, e.buf = nil, nil
	e.mu.Unlock()
	h := e.h
	h.mu.Lock()
	if h.eps[e.id] != e {
		h.mu.Unlock()
		return nil
	}
	delete(h.eps, e.id)
	for i, x := range h.idle {
		if x == e {
			h.idle = append(h.idle[:i], h.idle[i+1:]...)
			break
		}
	}
	e.cq.reserved -= e.need
	if !dirty {
		h.freeIDs = append(h.freeIDs, freeID{id: e.id, gen: gen})
	}
	bytes := int64(e.bufSz) * int64(e.cfg.Credits+e.cfg.SendDepth+2*reserve)
	h.bufBytes -= bytes
	h.mu.Unlock()
	h.M.Endpoints.Add(-1)
	h.M.BufferBytes.Add(-bytes)
	if mr != nil {
		mr.Close()
	}
	if buf != nil {
		buf.Free()
	}
	return nil
}

// InFlight reports the sends not yet completed and the receives posted (tests, teardown).
func (e *Endpoint) InFlight() (sends, recvs int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inflight, e.posted
}

// Flush waits (bounded by ctx) until the sends submitted so far have completed, or the
// endpoint is no longer connected: a teardown right after a Send would flush it unsent.
func (e *Endpoint) Flush(ctx context.Context) error {
	for {
		e.mu.Lock()
		n, st, w := e.inflight, e.state, e.wake
		e.mu.Unlock()
		if n == 0 {
			return nil
		}
		if st != stateConnected {
			return ErrNotConnected
		}
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
