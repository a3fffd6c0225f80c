package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

type sendReq struct {
	wr       verbs.SendWR
	psn      uint32
	signaled bool
	length   uint32
}

type qp struct {
	d        *device
	pd       *pd
	num      uint32
	cfg      verbs.QPConfig
	scq, rcq *cq

	mu        sync.Mutex
	state     verbs.QPState
	stateCh   chan struct{} // closed and replaced on every state change
	closed    bool
	access    verbs.Access // remote access this QP allows (set at INIT)
	remoteGID verbs.GID
	remoteQPN uint32
	rqpsn     uint32     // next PSN expected from the peer
	sqpsn     uint32     // next PSN to send
	sq        []*sendReq // posted, not yet transmitted
	inflight  []*sendReq // transmitted, awaiting the peer's response, in order
	rq        []verbs.RecvWR
	rqCh      chan struct{} // closed and replaced on every post_recv
	kick      chan struct{} // wakes the sender
	out, in   net.Conn      // requester stream (dialed), responder stream (accepted)
	stop      chan struct{} // closed when the QP leaves service
	wg        sync.WaitGroup
}

func newQP(d *device, p *pd, num uint32, cfg verbs.QPConfig, scq, rcq *cq) *qp {
	return &qp{
		d: d, pd: p, num: num, cfg: cfg, scq: scq, rcq: rcq,
		stateCh: make(chan struct{}), rqCh: make(chan struct{}),
		kick: make(chan struct{}, 1), stop: make(chan struct{}),
	}
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) setStateLocked(s verbs.QPState) {
	q.state = s
	close(q.stateCh)
	q.stateCh = make(chan struct{})
}

func (q *qp) Modify(a verbs.QPAttr) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return verbs.ErrClosed
	}
	if err := verbs.CheckTransition(q.state, a.State); err != nil {
		q.mu.Unlock()
		return err
	}
	switch a.State {
	case verbs.QPInit:
		if a.PortNum != portNum {
			q.mu.Unlock()
			return fmt.Errorf("%w: port %d (soft devices have port %d)", verbs.ErrInvalid, a.PortNum, portNum)
		}
		q.access = a.Access
	case verbs.QPRTR:
		if a.DestQPNum == 0 || a.DestQPNum > psnMask || a.RemoteGID.IsZero() {
			q.mu.Unlock()
			return fmt.Errorf("%w: RTR needs a remote GID and QP number", verbs.ErrInvalid)
		}
		if a.Path.SGIDIndex != 0 { // the table has index 0 only (GIDTable)
			q.mu.Unlock()
			return fmt.Errorf("%w: source gid index %d is not in the port's GID table (valid: 0)", verbs.ErrInvalid, a.Path.SGIDIndex)
		}
		q.remoteGID, q.remoteQPN, q.rqpsn = a.RemoteGID, a.DestQPNum, a.RQPSN&psnMask
	case verbs.QPRTS:
		if q.state == verbs.QPRTR {
			q.sqpsn = a.SQPSN & psnMask
			q.wg.Add(1)
			go q.sendLoop(q.stop)
		}
	case verbs.QPErr:
		wcs, rwcs := q.failLocked(nil, verbs.StatusWRFlushErr)
		q.mu.Unlock()
		q.scq.push(wcs...)
		q.rcq.push(rwcs...)
		return nil
	case verbs.QPReset:
		q.teardownLocked()
		q.setStateLocked(verbs.QPReset)
		q.mu.Unlock()
		q.wg.Wait()
		q.mu.Lock()
		q.stop = make(chan struct{})
		q.mu.Unlock()
		return nil
	}
	q.setStateLocked(a.State)
	q.mu.Unlock()
	return nil
}

func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.teardownLocked()
	q.mu.Unlock()
	q.d.mu.Lock()
	delete(q.d.qps, q.num)
	q.d.mu.Unlock()
	q.wg.Wait()
	return nil
}

// teardownLocked drops every queued WR without completions (destroy/reset semantics) and
// stops the QP's goroutines.
func (q *qp) teardownLocked() {
	q.sq, q.inflight, q.rq = nil, nil, nil
	q.stopLocked()
}

func (q *qp) stopLocked() {
	select {
	case <-q.stop:
	default:
		close(q.stop)
	}
	if q.out != nil {
		q.out.Close()
		q.out = nil
	}
	if q.in != nil {
		q.in.Close()
		q.in = nil
	}
}

// failLocked moves the QP to ERR. Completions come in posting order: failing (or, when nil,
// the oldest transmitted WR) gets status, everything else on the send queue and every
// posted receive is flushed. The caller pushes the returned completions after unlocking.
func (q *qp) failLocked(failing *sendReq, status verbs.WCStatus) (sends, recvs []verbs.WorkCompletion) {
	if q.state == verbs.QPErr || q.closed {
		return nil, nil
	}
	q.setStateLocked(verbs.QPErr)
	if failing == nil && len(q.inflight) > 0 {
		failing = q.inflight[0]
	}
	for _, list := range [][]*sendReq{q.inflight, q.sq} {
		for _, r := range list {
			st := verbs.StatusWRFlushErr
			if r == failing {
				st = status
			}
			sends = append(sends, verbs.WorkCompletion{ID: r.wr.ID, Status: st, Opcode: wcOpcode(r.wr.Opcode), QPNum: q.num})
		}
	}
	for _, r := range q.rq {
		recvs = append(recvs, verbs.WorkCompletion{ID: r.ID, Status: verbs.StatusWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.num})
	}
	q.sq, q.inflight, q.rq = nil, nil, nil
	q.stopLocked()
	return sends, recvs
}

func (q *qp) fail(failing *sendReq, status verbs.WCStatus) {
	q.mu.Lock()
	s, r := q.failLocked(failing, status)
	q.mu.Unlock()
	q.scq.push(s...)
	q.rcq.push(r...)
}

func wcOpcode(op verbs.Opcode) verbs.WCOpcode {
	switch op {
	case verbs.OpWrite, verbs.OpWriteWithImm:
		return verbs.WCWrite
	case verbs.OpRead:
		return verbs.WCRead
	}
	return verbs.WCSend
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, verbs.ErrClosed
	}
	switch q.state {
	case verbs.QPErr:
		// Posting to a QP in ERR succeeds and every WR completes flushed.
		var wcs []verbs.WorkCompletion
		for _, wr := range wrs {
			wcs = append(wcs, verbs.WorkCompletion{ID: wr.ID, Status: verbs.StatusWRFlushErr, Opcode: wcOpcode(wr.Opcode), QPNum: q.num})
		}
		q.scq.push(wcs...)
		return len(wrs), nil
	case verbs.QPRTS:
	default:
		return 0, fmt.Errorf("%w: post_send on a qp in %s", verbs.ErrInvalid, q.state)
	}
	// Injected (fault file stale_wc): a late completion of an earlier QP lands first.
	var old verbs.WorkCompletion
	if q.d.p.faults.takeStaleWC(q.d.name, func() (ok bool) { old, ok = q.d.lastWCOfOther(q.num); return ok }) {
		q.scq.push(old)
	}
	for i, wr := range wrs {
		if wr.Opcode > verbs.OpRead {
			return i, fmt.Errorf("%w: opcode %d", verbs.ErrInvalid, wr.Opcode)
		}
		if len(wr.SGL) > q.cfg.MaxSendSGE {
			return i, fmt.Errorf("%w: %d SGEs (max %d)", verbs.ErrInvalid, len(wr.SGL), q.cfg.MaxSendSGE)
		}
		var total uint64
		for _, s := range wr.SGL {
			total += uint64(s.Length)
		}
		if total > uint64(q.d.p.opt.MaxMsg) {
			return i, fmt.Errorf("%w: message of %d bytes (max %d)", verbs.ErrInvalid, total, q.d.p.opt.MaxMsg)
		}
		if len(q.sq)+len(q.inflight) >= q.cfg.MaxSendWR {
			return i, fmt.Errorf("%w: %d send WRs outstanding", verbs.ErrQueueFull, q.cfg.MaxSendWR)
		}
		wr.SGL = append([]verbs.SGE(nil), wr.SGL...)
		q.sq = append(q.sq, &sendReq{wr: wr, length: uint32(total),
			signaled: q.cfg.SignalAll || wr.Flags&verbs.SendSignaled != 0})
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
	return len(wrs), nil
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, verbs.ErrClosed
	}
	switch q.state {
	case verbs.QPReset:
		return 0, fmt.Errorf("%w: post_recv on a qp in RESET", verbs.ErrInvalid)
	case verbs.QPErr:
		var wcs []verbs.WorkCompletion
		for _, wr := range wrs {
			wcs = append(wcs, verbs.WorkCompletion{ID: wr.ID, Status: verbs.StatusWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.num})
		}
		q.rcq.push(wcs...)
		return len(wrs), nil
	}
	for i, wr := range wrs {
		if len(wr.SGL) > q.cfg.MaxRecvSGE {
			return i, fmt.Errorf("%w: %d SGEs (max %d)", verbs.ErrInvalid, len(wr.SGL), q.cfg.MaxRecvSGE)
		}
		if len(q.rq) >= q.cfg.MaxRecvWR {
			return i, fmt.Errorf("%w: %d receive WRs posted", verbs.ErrQueueFull, q.cfg.MaxRecvWR)
		}
		wr.SGL = append([]verbs.SGE(nil), wr.SGL...)
		q.rq = append(q.rq, wr)
	}
	close(q.rqCh)
	q.rqCh = make(chan struct{})
	return len(wrs), nil
}

// takeRecv pops the oldest posted receive, waiting up to the RNR timeout for one. It
// returns false with stopped set when the QP left service meanwhile (no NAK is due then).
func (q *qp) takeRecv(stop chan struct{}) (r verbs.RecvWR, ok, stopped bool) {
	t := time.NewTimer(q.d.p.opt.RNRTimeout)
	defer t.Stop()
	for {
		q.mu.Lock()
		if q.state == verbs.QPErr || q.closed {
			q.mu.Unlock()
			return verbs.RecvWR{}, false, true
		}
		if len(q.rq) > 0 {
			r := q.rq[0]
			q.rq = q.rq[1:]
			q.mu.Unlock()
			return r, true, false
		}
		ch := q.rqCh
		q.mu.Unlock()
		select {
		case <-ch:
		case <-stop:
			return verbs.RecvWR{}, false, true
		case <-t.C:
			return verbs.RecvWR{}, false, false
		}
	}
}

// localSpan resolves an SGE against this QP's PD with the needed access, returning the MR
// read-locked (release with m.mu.RUnlock) or a local protection error.
func (q *qp) localSpan(s verbs.SGE, need verbs.Access) (*mr, []byte, bool) {
	m := q.d.lookupMR(s.LKey)
	if m == nil || m.pd != q.pd {
		return nil, nil, false
	}
	m.mu.RLock()
	if m.closed || m.access&need != need {
		m.mu.RUnlock()
		return nil, nil, false
	}
	b, ok := m.span(s.Addr, s.Length)
	if !ok {
		m.mu.RUnlock()
		return nil, nil, false
	}
	return m, b, true
}

// remoteSpan makes the responder's checks for a WRITE or READ: the rkey names a live MR of
// this QP's PD, the MR and the QP allow the access, [addr, addr+n) lies inside the MR.
func (q *qp) remoteSpan(rkey uint32, addr uint64, n uint32, need verbs.Access) (*mr, []byte, bool) {
	if n == 0 {
		return nil, nil, true // zero-length transfers check no key, as on hardware
	}
	q.mu.Lock()
	allowed := q.access&need == need
	q.mu.Unlock()
	if !allowed {
		return nil, nil, false
	}
	m := q.d.lookupMR(rkey)
	if m == nil || m.pd != q.pd {
		return nil, nil, false
	}
	m.mu.RLock()
	if m.closed || m.access&need != need {
		m.mu.RUnlock()
		return nil, nil, false
	}
	b, ok := m.span(addr, n)
	if !ok {
		m.mu.RUnlock()
		return nil, nil, false
	}
	return m, b, true
}

var errStopped = errors.New("soft: qp left service")

// dial opens the requester stream to the peer's device and waits for it to accept.
func (q *qp) dial(stop chan struct{}) (net.Conn, error) {
	q.mu.Lock()
	gid, qpn := q.remoteGID, q.remoteQPN
	q.mu.Unlock()
	opt := q.d.p.opt
	c, err := net.DialTimeout("unix", sockName(gid), opt.AckTimeout)
	if err != nil {
		return nil, fmt.Errorf("soft: dial peer %s: %w", gid, err)
	}
	c.SetDeadline(time.Now().Add(opt.AckTimeout))
	if _, err := c.Write(hello{srcGID: q.d.gid, srcQPN: q.num, dstQPN: qpn}.encode()); err != nil {
		c.Close()
		return nil, fmt.Errorf("soft: hello to qp %d: %w", qpn, err)
	}
	var rb [respLen]byte
	if _, err := io.ReadFull(c, rb[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("soft: hello reply from qp %d: %w", qpn, err)
	}
	r, err := decodeResponse(rb[:], opt.MaxMsg)
	if err != nil || r.kind != kAck {
		c.Close()
		return nil, fmt.Errorf("soft: peer qp %d refused the connection", qpn)
	}
	c.SetDeadline(time.Time{})
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-stop:
		c.Close()
		return nil, errStopped
	default:
	}
	q.out = c
	if len(q.inflight) > 0 {
		c.SetReadDeadline(time.Now().Add(opt.AckTimeout))
	}
	q.wg.Add(1)
	go q.ackLoop(c, stop)
	return c, nil
}

// stallPoll is how often a send loop held by an injected PortStall looks at the fault again.
const stallPoll = 10 * time.Millisecond

// sendLoop transmits the send queue in order.
func (q *qp) sendLoop(stop chan struct{}) {
	defer q.wg.Done()
	opt := q.d.p.opt
	var conn net.Conn
	hdr := make([]byte, reqLen)
	for {
		q.mu.Lock()
		for len(q.sq) == 0 && q.state == verbs.QPRTS {
			q.mu.Unlock()
			select {
			case <-q.kick:
			case <-stop:
				return
			}
			q.mu.Lock()
		}
		if q.state != verbs.QPRTS {
			q.mu.Unlock()
			return
		}
		if q.d.fault().PortStall {
			// Injected: the port is down but nothing tells the QP; its WRs wait for the link.
			q.mu.Unlock()
			select {
			case <-time.After(stallPoll):
			case <-stop:
				return
			}
			continue
		}
		r := q.sq[0]
		q.sq = q.sq[1:]
		r.psn = q.sqpsn
		q.sqpsn = (q.sqpsn + 1) & psnMask
		q.inflight = append(q.inflight, r)
		if len(q.inflight) == 1 && q.out != nil {
			q.out.SetReadDeadline(time.Now().Add(opt.AckTimeout))
		}
		q.mu.Unlock()

		// Injected faults (test-only fault file): a down port or a planned completion error
		// fails this WR before it leaves, as a link that stopped answering would.
		if q.d.fault().PortDown {
			q.fail(r, verbs.StatusRetryExcErr)
			return
		}
		if st, ok := q.d.p.faults.takeCompErr(q.d.name); ok {
			q.fail(r, st)
			return
		}
		if conn == nil {
			c, err := q.dial(stop)
			if err != nil {
				if !errors.Is(err, errStopped) {
					q.d.p.opt.Logger.Debug("soft: requester stream", "qp", q.num, "err", err)
					q.fail(nil, verbs.StatusRetryExcErr)
				}
				return
			}
			conn = c
		}
		// Gather the local side: sources for WRITE/SEND, destinations checked for READ.
		need := verbs.Access(0)
		if r.wr.Opcode == verbs.OpRead {
			need = verbs.AccessLocalWrite
		}
		bufs := net.Buffers{hdr}
		var held []*mr
		ok := true
		for _, s := range r.wr.SGL {
			m, b, good := q.localSpan(s, need)
			if !good {
				ok = false
				break
			}
			held = append(held, m)
			if r.wr.Opcode != verbs.OpRead && len(b) > 0 {
				bufs = append(bufs, b)
			}
		}
		if r.wr.Opcode == verbs.OpRead {
			for _, m := range held {
				m.mu.RUnlock()
			}
			held = nil
		}
		if !ok {
			for _, m := range held {
				m.mu.RUnlock()
			}
			q.fail(r, verbs.StatusLocProtErr)
			return
		}
		req := request{psn: r.psn, raddr: r.wr.RemoteAddr, rkey: r.wr.RKey, length: r.length, imm: r.wr.Imm}
		switch r.wr.Opcode {
		case verbs.OpWrite:
			req.kind = kWrite
		case verbs.OpWriteWithImm:
			req.kind = kWriteWithImm
		case verbs.OpSend:
			req.kind = kSend
		case verbs.OpSendWithImm:
			req.kind = kSendWithImm
		case verbs.OpRead:
			req.kind = kRead
		}
		req.encode(hdr)
		conn.SetWriteDeadline(time.Now().Add(opt.AckTimeout))
		_, err := bufs.WriteTo(conn)
		for _, m := range held {
			m.mu.RUnlock()
		}
		if err != nil {
			// The peer closed or stopped reading. Its answers to what it did read (a NAK
			// that explains the close) are still in the stream: the ack loop reads them
			// and then fails the QP on EOF or on its deadline.
			q.d.p.opt.Logger.Debug("soft: requester write", "qp", q.num, "err", err)
			return
		}
	}
}

// ackLoop reads the responder's answers and completes the send queue in order.
func (q *qp) ackLoop(c net.Conn, stop chan struct{}) {
	defer q.wg.Done()
	opt := q.d.p.opt
	var rb [respLen]byte
	for {
		if _, err := io.ReadFull(c, rb[:]); err != nil {
			q.streamGone(c, err)
			return
		}
		resp, err := decodeResponse(rb[:], opt.MaxMsg)
		q.mu.Lock()
		if q.out != c {
			q.mu.Unlock()
			return
		}
		if err != nil || len(q.inflight) == 0 || q.inflight[0].psn != resp.psn {
			q.mu.Unlock()
			opt.Logger.Debug("soft: bad response", "qp", q.num, "err", err)
			q.fail(nil, verbs.StatusGeneralErr)
			return
		}
		r := q.inflight[0]
		q.mu.Unlock()
		isRead := r.wr.Opcode == verbs.OpRead
		switch {
		case resp.kind == kNak:
			q.fail(r, resp.status)
			return
		case resp.kind == kReadResp && isRead:
			if resp.length != r.length {
				q.fail(r, verbs.StatusGeneralErr)
				return
			}
			c.SetReadDeadline(time.Now().Add(opt.AckTimeout))
			for _, s := range r.wr.SGL {
				m, b, ok := q.localSpan(s, verbs.AccessLocalWrite)
				if !ok {
					q.fail(r, verbs.StatusLocProtErr)
					return
				}
				_, err := io.ReadFull(c, b)
				m.mu.RUnlock()
				if err != nil {
					q.streamGone(c, err)
					return
				}
			}
		case resp.kind == kAck && !isRead:
		default:
			q.fail(r, verbs.StatusGeneralErr)
			return
		}
		if d := q.d.fault().Delay; d > 0 {
			select { // injected: a slow completion
			case <-time.After(d):
			case <-stop:
				return
			}
		}
		q.mu.Lock()
		if q.out != c || len(q.inflight) == 0 || q.inflight[0] != r {
			q.mu.Unlock()
			return
		}
		q.inflight = q.inflight[1:]
		if len(q.inflight) > 0 {
			c.SetReadDeadline(time.Now().Add(opt.AckTimeout))
		} else {
			c.SetReadDeadline(time.Time{})
		}
		if r.signaled {
			wc := verbs.WorkCompletion{ID: r.wr.ID, Status: verbs.StatusSuccess, Opcode: wcOpcode(r.wr.Opcode), QPNum: q.num}
			if isRead {
				wc.ByteLen = r.length
			}
			// Recorded before it is pushed: a completion a poller has seen is already the
			// device's last one (the stale_wc fault replays it on the next QP).
			q.d.recordWC(wc)
			q.scq.push(wc) // under q.mu: keeps success and flush completions in order
		}
		q.mu.Unlock()
	}
}

// streamGone handles a requester or responder stream that broke: the peer died, destroyed
// its QP, or stopped answering. The WR in flight fails with transport retry exceeded.
func (q *qp) streamGone(c net.Conn, err error) {
	q.mu.Lock()
	if q.out != c && q.in != c {
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	q.d.p.opt.Logger.Debug("soft: stream closed", "qp", q.num, "err", err)
	q.fail(nil, verbs.StatusRetryExcErr)
}

// acceptInbound binds a requester stream to this QP once it is RTR or RTS.
func (q *qp) acceptInbound(h hello, c net.Conn) (bool, <-chan struct{}, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return false, nil, errors.New("qp destroyed")
	case q.state == verbs.QPReset || q.state == verbs.QPInit:
		return false, q.stateCh, nil
	case q.state == verbs.QPErr:
		return false, nil, errors.New("qp in error")
	case h.srcGID != q.remoteGID || h.srcQPN != q.remoteQPN:
		return false, nil, fmt.Errorf("qp connected to %s/%d, not %s/%d", q.remoteGID, q.remoteQPN, h.srcGID, h.srcQPN)
	case q.in != nil:
		return false, nil, errors.New("qp already has a requester stream")
	}
	q.in = c
	q.wg.Add(1)
	go q.respondLoop(c, q.stop)
	return true, nil, nil
}

// respondLoop executes the peer's requests in order: the responder half of the NIC.
func (q *qp) respondLoop(c net.Conn, stop chan struct{}) {
	defer q.wg.Done()
	opt := q.d.p.opt
	c.SetDeadline(time.Now().Add(opt.AckTimeout))
	if _, err := c.Write(response{kind: kAck}.encode()); err != nil {
		q.streamGone(c, err)
		return
	}
	c.SetDeadline(time.Time{})
	nak := func(psn uint32, st verbs.WCStatus) {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write(response{kind: kNak, status: st, psn: psn}.encode())
		// Both ends of the connection go to ERR: the requester on the NAK, we here.
		q.fail(nil, verbs.StatusWRFlushErr)
	}
	var hb [reqLen]byte
	for {
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			q.streamGone(c, err)
			return
		}
		req, err := decodeRequest(hb[:], opt.MaxMsg)
		if err != nil {
			opt.Logger.Debug("soft: bad request", "qp", q.num, "err", err)
			nak(0, verbs.StatusRemInvReqErr)
			return
		}
		if q.d.fault().PortDown {
			// Injected: this side's link is down. The requester sees its stream end.
			q.fail(nil, verbs.StatusRetryExcErr)
			return
		}
		q.mu.Lock()
		if q.in != c {
			q.mu.Unlock()
			return
		}
		if req.psn != q.rqpsn {
			q.mu.Unlock()
			nak(req.psn, verbs.StatusRemInvReqErr)
			return
		}
		q.rqpsn = (q.rqpsn + 1) & psnMask
		q.mu.Unlock()
		op := verbs.OpWrite
		switch req.kind {
		case kWrite, kWriteWithImm:
			if req.kind == kWriteWithImm {
				op = verbs.OpWriteWithImm
			}
			m, b, ok := q.remoteSpan(req.rkey, req.raddr, req.length, verbs.AccessRemoteWrite)
			if !ok {
				nak(req.psn, verbs.StatusRemAccessErr)
				return
			}
			var rwr verbs.RecvWR
			if req.kind == kWriteWithImm {
				var stopped bool
				if rwr, ok, stopped = q.takeRecv(stop); !ok {
					if m != nil {
						m.mu.RUnlock()
					}
					if !stopped {
						nak(req.psn, verbs.StatusRNRRetryExcErr)
					}
					return
				}
			}
			c.SetReadDeadline(time.Now().Add(opt.AckTimeout))
			_, err := io.ReadFull(c, b)
			if m != nil {
				m.mu.RUnlock()
			}
			c.SetReadDeadline(time.Time{})
			if err != nil {
				q.streamGone(c, err)
				return
			}
			if req.kind == kWriteWithImm {
				q.completeRecv(rwr, verbs.WorkCompletion{Opcode: verbs.WCRecvWithImm, ByteLen: req.length, Imm: req.imm, HasImm: true})
			}
		case kSend, kSendWithImm:
			op = verbs.OpSend
			rwr, ok, stopped := q.takeRecv(stop)
			if !ok {
				if !stopped {
					nak(req.psn, verbs.StatusRNRRetryExcErr)
				}
				return
			}
			st, err := q.scatter(c, rwr, req.length)
			if err != nil {
				q.streamGone(c, err)
				return
			}
			if st != verbs.StatusSuccess {
				q.rcq.push(verbs.WorkCompletion{ID: rwr.ID, Status: st, Opcode: verbs.WCRecv, QPNum: q.num})
				remote := verbs.StatusRemInvReqErr
				if st == verbs.StatusLocProtErr {
					remote = verbs.StatusRemOpErr
				}
				nak(req.psn, remote)
				return
			}
			wc := verbs.WorkCompletion{Opcode: verbs.WCRecv, ByteLen: req.length}
			if req.kind == kSendWithImm {
				wc.Imm, wc.HasImm = req.imm, true
			}
			q.completeRecv(rwr, wc)
		case kRead:
			op = verbs.OpRead
			m, b, ok := q.remoteSpan(req.rkey, req.raddr, req.length, verbs.AccessRemoteRead)
			if !ok {
				nak(req.psn, verbs.StatusRemAccessErr)
				return
			}
			c.SetWriteDeadline(time.Now().Add(opt.AckTimeout))
			bufs := net.Buffers{response{kind: kReadResp, psn: req.psn, length: req.length}.encode()}
			if len(b) > 0 {
				bufs = append(bufs, b)
			}
			_, err := bufs.WriteTo(c)
			if m != nil {
				m.mu.RUnlock()
			}
			if err != nil {
				q.streamGone(c, err)
				return
			}
			continue
		}
		if opt.AckDelay != nil {
			if d := opt.AckDelay(op); d > 0 {
				select {
				case <-time.After(d):
				case <-stop:
					return
				}
			}
		}
		c.SetWriteDeadline(time.Now().Add(opt.AckTimeout))
		if _, err := c.Write(response{kind: kAck, psn: req.psn}.encode()); err != nil {
			q.streamGone(c, err)
			return
		}
	}
}

// scatter places an incoming SEND's payload into a receive WR's SGEs. A receive too small
// is a local length error, an SGE outside registered memory a local protection error; in
// both cases the payload is not consumed (the connection is torn down after the NAK).
func (q *qp) scatter(c net.Conn, rwr verbs.RecvWR, n uint32) (verbs.WCStatus, error) {
	var capacity uint64
	for _, s := range rwr.SGL {
		capacity += uint64(s.Length)
	}
	if capacity < uint64(n) {
		return verbs.StatusLocLenErr, nil
	}
	left := n
	c.SetReadDeadline(time.Now().Add(q.d.p.opt.AckTimeout))
	defer c.SetReadDeadline(time.Time{})
	for _, s := range rwr.SGL {
		if left == 0 {
			break
		}
		take := min(left, s.Length)
		m, b, ok := q.localSpan(verbs.SGE{Addr: s.Addr, Length: take, LKey: s.LKey}, verbs.AccessLocalWrite)
		if !ok {
			return verbs.StatusLocProtErr, nil
		}
		_, err := io.ReadFull(c, b)
		m.mu.RUnlock()
		if err != nil {
			return verbs.StatusSuccess, err
		}
		left -= take
	}
	return verbs.StatusSuccess, nil
}

// completeRecv reports a consumed receive, or flushes it if the QP failed meanwhile (so no
// success follows a flush on the receive CQ).
func (q *qp) completeRecv(rwr verbs.RecvWR, wc verbs.WorkCompletion) {
	wc.ID, wc.QPNum = rwr.ID, q.num
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == verbs.QPErr || q.closed {
		wc = verbs.WorkCompletion{ID: rwr.ID, Status: verbs.StatusWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.num}
	}
	q.rcq.push(wc)
}
