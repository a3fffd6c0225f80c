package soft

import (
	"encoding/binary"
	"fmt"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// The soft NIC's own little wire protocol between two devices (one host, one build), little
// endian, fixed-size headers. Every header read from a peer is decoded fail-closed.

const (
	helloMagic   = 0x43494e53 // "SNIC"
	helloVersion = 1
	helloLen     = 32
	reqLen       = 32
	respLen      = 16
)

// request kinds (requester -> responder)
const (
	kWrite        = 1
	kWriteWithImm = 2
	kSend         = 3
	kSendWithImm  = 4
	kRead         = 5
)

// response kinds (responder -> requester)
const (
	kAck      = 16
	kNak      = 17
	kReadResp = 18
)

type hello struct {
	srcGID verbs.GID
	srcQPN uint32
	dstQPN uint32
}

func (h hello) encode() []byte {
	b := make([]byte, helloLen)
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint16(b[4:], helloVersion)
	copy(b[8:24], h.srcGID[:])
	binary.LittleEndian.PutUint32(b[24:], h.srcQPN)
	binary.LittleEndian.PutUint32(b[28:], h.dstQPN)
	return b
}

func decodeHello(b []byte) (hello, error) {
	if len(b) != helloLen {
		return hello{}, fmt.Errorf("soft: hello of %d bytes", len(b))
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != helloMagic {
		return hello{}, fmt.Errorf("soft: bad hello magic %#x", m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != helloVersion {
		return hello{}, fmt.Errorf("soft: hello version %d, want %d", v, helloVersion)
	}
	if b[6] != 0 || b[7] != 0 {
		return hello{}, fmt.Errorf("soft: reserved hello bytes set")
	}
	var h hello
	copy(h.srcGID[:], b[8:24])
	h.srcQPN = binary.LittleEndian.Uint32(b[24:])
	h.dstQPN = binary.LittleEndian.Uint32(b[28:])
	return h, nil
}

type request struct {
	kind   uint8
	psn    uint32
	raddr  uint64
	rkey   uint32
	length uint32
	imm    uint32
}

func (r request) encode(b []byte) {
	b[0] = r.kind
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], r.psn)
	binary.LittleEndian.PutUint64(b[8:], r.raddr)
	binary.LittleEndian.PutUint32(b[16:], r.rkey)
	binary.LittleEndian.PutUint32(b[20:], r.length)
	binary.LittleEndian.PutUint32(b[24:], r.imm)
	binary.LittleEndian.PutUint32(b[28:], 0)
}

func decodeRequest(b []byte, maxMsg uint32) (request, error) {
	if len(b) != reqLen {
		return request{}, fmt.Errorf("soft: request header of %d bytes", len(b))
	}
	r := request{
		kind:   b[0],
		psn:    binary.LittleEndian.Uint32(b[4:]),
		raddr:  binary.LittleEndian.Uint64(b[8:]),
		rkey:   binary.LittleEndian.Uint32(b[16:]),
		length: binary.LittleEndian.Uint32(b[20:]),
		imm:    binary.LittleEndian.Uint32(b[24:]),
	}
	if r.kind < kWrite || r.kind > kRead {
		return request{}, fmt.Errorf("soft: unknown request kind %d", r.kind)
	}
	if b[1] != 0 || b[2] != 0 || b[3] != 0 || binary.LittleEndian.Uint32(b[28:]) != 0 {
		return request{}, fmt.Errorf("soft: reserved request bytes set")
	}
	if r.psn > psnMask {
		return request{}, fmt.Errorf("soft: psn %#x wider than 24 bits", r.psn)
	}
	if r.length > maxMsg {
		return request{}, fmt.Errorf("soft: message of %d bytes exceeds max %d", r.length, maxMsg)
	}
	return r, nil
}

type response struct {
	kind   uint8
	status verbs.WCStatus
	psn    uint32
	length uint32
}

func (r response) encode() []byte {
	b := make([]byte, respLen)
	b[0] = r.kind
	b[1] = uint8(r.status)
	binary.LittleEndian.PutUint32(b[4:], r.psn)
	binary.LittleEndian.PutUint32(b[8:], r.length)
	return b
}

func decodeResponse(b []byte, maxMsg uint32) (response, error) {
	if len(b) != respLen {
		return response{}, fmt.Errorf("soft: response header of %d bytes", len(b))
	}
	r := response{
		kind:   b[0],
		status: verbs.WCStatus(b[1]),
		psn:    binary.LittleEndian.Uint32(b[4:]),
		length: binary.LittleEndian.Uint32(b[8:]),
	}
	switch r.kind {
	case kAck, kReadResp:
		if r.status != verbs.StatusSuccess {
			return response{}, fmt.Errorf("soft: %d response with status %d", r.kind, r.status)
		}
	case kNak:
		if r.status == verbs.StatusSuccess {
			return response{}, fmt.Errorf("soft: NAK without a status")
		}
	default:
		return response{}, fmt.Errorf("soft: unknown response kind %d", r.kind)
	}
	if r.kind != kReadResp && r.length != 0 {
		return response{}, fmt.Errorf("soft: response kind %d carries %d bytes", r.kind, r.length)
	}
	if r.length > maxMsg {
		return response{}, fmt.Errorf("soft: read response of %d bytes exceeds max %d", r.length, maxMsg)
	}
	if b[2] != 0 || b[3] != 0 || binary.LittleEndian.Uint32(b[12:]) != 0 {
		return response{}, fmt.Errorf("soft: reserved response bytes set")
	}
	return r, nil
}

const psnMask = 1<<24 - 1
