package soft

import (
	"testing"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

func TestWireRoundTrip(t *testing.T) {
	h := hello{srcGID: verbs.GID{0xfe, 0x80, 15: 9}, srcQPN: 0x123, dstQPN: 0x456}
	if got, err := decodeHello(h.encode()); err != nil || got != h {
		t.Fatalf("hello %+v %v", got, err)
	}
	r := request{kind: kWriteWithImm, psn: psnMask, raddr: 1 << 47, rkey: 7, length: 4096, imm: 1}
	b := make([]byte, reqLen)
	r.encode(b)
	if got, err := decodeRequest(b, 1<<20); err != nil || got != r {
		t.Fatalf("request %+v %v", got, err)
	}
	p := response{kind: kReadResp, psn: 5, length: 10}
	if got, err := decodeResponse(p.encode(), 1<<20); err != nil || got != p {
		t.Fatalf("response %+v %v", got, err)
	}
}

func TestWireRejects(t *testing.T) {
	good := make([]byte, reqLen)
	request{kind: kWrite, length: 10}.encode(good)
	mut := func(f func(b []byte)) []byte { b := append([]byte(nil), good...); f(b); return b }
	for name, b := range map[string][]byte{
		"short":      good[:31],
		"kind 0":     mut(func(b []byte) { b[0] = 0 }),
		"kind 6":     mut(func(b []byte) { b[0] = 6 }),
		"reserved":   mut(func(b []byte) { b[2] = 1 }),
		"psn 25 bit": mut(func(b []byte) { b[7] = 1 }),
		"too long":   mut(func(b []byte) { b[23] = 0x80 }),
	} {
		if _, err := decodeRequest(b, 1<<20); err == nil {
			t.Errorf("request %s accepted", name)
		}
	}
	for name, r := range map[string]response{
		"ack with status":   {kind: kAck, status: verbs.StatusRemAccessErr},
		"nak without":       {kind: kNak},
		"ack with length":   {kind: kAck, length: 1},
		"unknown":           {kind: 3},
		"read resp too big": {kind: kReadResp, length: 1<<20 + 1},
	} {
		if _, err := decodeResponse(r.encode(), 1<<20); err == nil {
			t.Errorf("response %s accepted", name)
		}
	}
	hb := hello{}.encode()
	hb[0] ^= 1
	if _, err := decodeHello(hb); err == nil {
		t.Error("hello with bad magic accepted")
	}
}

func FuzzDecodeSoftWire(f *testing.F) {
	b := make([]byte, reqLen)
	request{kind: kRead, psn: 3, length: 99}.encode(b)
	f.Add(b)
	f.Add(response{kind: kNak, status: verbs.StatusRemAccessErr}.encode())
	f.Add(hello{srcQPN: 1, dstQPN: 2}.encode())
	f.Fuzz(func(t *testing.T, in []byte) {
		if r, err := decodeRequest(in, 1<<20); err == nil {
			out := make([]byte, reqLen)
			r.encode(out)
			if string(out) != string(in) {
				t.Fatalf("request %x re-encodes as %x", in, out)
			}
		}
		if r, err := decodeResponse(in, 1<<20); err == nil && string(r.encode()) != string(in) {
			t.Fatalf("response %x re-encodes differently", in)
		}
		if h, err := decodeHello(in); err == nil && string(h.encode()) != string(in) {
			t.Fatalf("hello %x re-encodes differently", in)
		}
	})
}
