package onesided

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"

	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// RDMA v1 (DCP1): two-sided SEND/RECV. A request is one SEND of a dfkv request prefix plus
// the PUT payload into one of the server's posted receive buffers; a reply is one SEND of a
// response prefix plus the GET payload into one of the client's. Both sides post depth
// buffers of dcp.SlotSize(block) bytes on their own registered memory; no receive segment.

// v1ReplyOffset is where a v1 GET value is read into a staging slot (page aligned for the
// engine's direct reads); the response prefix is written just before the requested range so
// that prefix and range leave in one SGE.
const v1ReplyOffset = dcp.SlotPayloadOffset

func (s *Server) serveV1(ctx context.Context, boot net.Conn, offer dcp.Tail) (err error) {
	cfg := s.cfg
	c := &serverConn{s: s, depth: int(min(offer.Depth, cfg.Depth)), slot: dcp.SlotSize(offer.MaxBlock), block: offer.MaxBlock}
	defer c.close()
	c.busy = make([]bool, c.depth)
	c.release = make([]func(), c.depth)
	area := c.depth * int(c.slot)
	if c.cq, err = s.ctx.CreateCQ(2*c.depth + 1); err != nil {
		return s.refuse(boot, err)
	}
	if c.qp, err = s.pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: c.cq, RecvCQ: c.cq,
		MaxSendWR: c.depth + 1, MaxRecvWR: c.depth, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return s.refuse(boot, err)
	}
	// respBuf receives the requests here; stageBuf holds the replies.
	if c.respBuf, err = verbs.AllocBuffer(area); err != nil {
		return s.refuse(boot, err)
	}
	if c.resp, err = s.pd.RegMR(c.respBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return s.refuse(boot, err)
	}
	if c.stageBuf, err = verbs.AllocBuffer(area); err != nil {
		return s.refuse(boot, err)
	}
	if c.stage, err = s.pd.RegMR(c.stageBuf.Bytes(), verbs.AccessLocalWrite); err != nil {
		return s.refuse(boot, err)
	}
	gid, err := chooseGID(s.ctx, s.port, boot, cfg.GID, &offer.Rails[0])
	if err != nil {
		return s.refuse(boot, err)
	}
	path := gid.Path(cfg.GID)
	local := s.rail(c.qp.Num(), rand.Uint32()&0xffffff)
	local.GID, local.GIDType = gid.Entry.GID, gid.Entry.Type
	if err := verbs.Connect(c.qp, s.port.Num, verbs.AccessLocalWrite, local.Endpoint(), offer.Rails[0].Endpoint(), path); err != nil {
		return s.refuse(boot, err)
	}
	recvs := make([]verbs.RecvWR, c.depth)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: recvTag | uint64(i), SGL: []verbs.SGE{verbs.SGEOf(c.resp, i*int(c.slot), int(c.slot))}}
	}
	if _, err := c.qp.PostRecv(recvs); err != nil {
		return s.refuse(boot, err)
	}
	ans := dcp.Tail{Version: dcp.V1, MaxBlock: offer.MaxBlock, Depth: uint32(c.depth), Rails: []dcp.Rail{local}}
	sn, err := s.acceptNotify(boot, offer, &ans, path)
	if err != nil {
		return s.refuse(boot, err)
	}
	if err := writeFrame(boot, frameTail, dcp.Encode(ans), cfg.IOTimeout); err != nil {
		sn.end(s, false)
		return fmt.Errorf("onesided: send answer: %w", err)
	}
	s.M.V1ConnsOpened.Add(1)
	s.M.ActiveConns.Add(1)
	defer s.M.ActiveConns.Add(-1)
	cctx, stop := s.watch(ctx, boot, sn)
	s.track(sn, true)
	err = c.loopV1(cctx)
	stop()
	s.track(sn, false)
	sn.end(s, s.gone(ctx))
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (c *serverConn) loopV1(ctx context.Context) error {
	s := c.s
	next := 0
	for {
		wc, err := c.nextRecv(ctx)
		if err != nil {
			return err
		}
		if wc.Opcode != verbs.WCRecv || wc.HasImm || wc.ID != recvTag|uint64(next) ||
			wc.ByteLen < wire.RequestSize || uint64(wc.ByteLen) > c.slot {
			return c.fail("completion %+v, want a RECV of a request into slot %d", wc, next)
		}
		slot := next
		next = (next + 1) % c.depth
		in := c.respBuf.Bytes()[uint64(slot)*c.slot : uint64(slot)*c.slot+uint64(wc.ByteLen)]
		req, err := wire.DecodeRequest(in[:wire.RequestSize])
		if err != nil {
			return c.fail("request prefix: %v", err)
		}
		if req.PayloadLen != uint64(wc.ByteLen)-wire.RequestSize {
			return c.fail("%s request with %d payload bytes in a %d-byte message", req.Op, req.PayloadLen, wc.ByteLen)
		}
		if c.busy[slot] {
			s.M.PinWaits.Add(1)
		}
		for c.busy[slot] {
			if err := c.poll(); err != nil {
				return err
			}
			if !c.busy[slot] {
				break
			}
			if err := c.cq.Wait(ctx); err != nil {
				return err
			}
		}
		stage := c.stageBuf.Bytes()[uint64(slot)*c.slot : uint64(slot+1)*c.slot]
		resp, off, n := c.handleV1(req, in[wire.RequestSize:], stage)
		// The request buffer was consumed: hand it back to the NIC.
		if _, err := c.qp.PostRecv([]verbs.RecvWR{{ID: recvTag | uint64(slot),
			SGL: []verbs.SGE{verbs.SGEOf(c.resp, slot*int(c.slot), int(c.slot))}}}); err != nil {
			return c.fail("repost receive: %v", err)
		}
		at := int(off) - wire.ResponseSize
		resp.Encode(stage[at : at+wire.ResponseSize])
		c.busy[slot] = true
		s.M.PinsHeld.Add(1)
		if _, err := c.qp.PostSend([]verbs.SendWR{{ID: uint64(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEOf(c.stage, slot*int(c.slot)+at, wire.ResponseSize+int(n))}}}); err != nil {
			return c.fail("post reply: %v", err)
		}
	}
}

// handleV1 executes one request; a GET's value is read into stage at v1ReplyOffset and the
// reply covers stage[off : off+n] after its prefix.
func (c *serverConn) handleV1(req wire.Request, payload, stage []byte) (resp wire.Response, off, n uint64) {
	s := c.s
	key := store.Key{ID: req.ID, Tenant: req.Tenant}
	resp = wire.Response{Op: req.Op, Status: fb.StatusOk}
	off = v1ReplyOffset
	switch req.Op {
	case fb.OpPut:
		if len(payload) == 0 || uint64(len(payload)) > c.block {
			resp.Status = fb.StatusInvalid
			return
		}
		s.M.V1Puts.Add(1)
		resp.Status = statusOf(s.engine.Put(key, len(payload), func(dst []byte) error {
			copy(dst, payload)
			return nil
		}))
	case fb.OpGet:
		v, err := store.ReadInto(s.engine, key, stage[v1ReplyOffset:])
		resp.ValueLen = uint64(max(v, 0))
		if err != nil {
			resp.Status = statusOf(err)
			if errors.Is(err, store.ErrBufferTooSmall) {
				resp.Status = fb.StatusInvalid // larger than this connection's declared block
			}
			return
		}
		length := req.Length
		if req.Offset > uint64(v) || (length != 0 && length > uint64(v)-req.Offset) {
			resp.Status = fb.StatusInvalid
			return
		}
		if length == 0 {
			length = uint64(v) - req.Offset
		}
		s.M.V1Gets.Add(1)
		resp.PayloadLen = length
		return resp, v1ReplyOffset + req.Offset, length
	case fb.OpExist:
		v, err := s.engine.Stat(key)
		resp.Status, resp.ValueLen = statusOf(err), uint64(max(v, 0))
	case fb.OpRemove:
		resp.Status = statusOf(s.engine.Remove(key))
	default:
		resp.Status = fb.StatusInvalid
	}
	return
}
