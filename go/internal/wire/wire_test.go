package wire

import (
	"errors"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"
	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// The hand-written size constants must match what the generated builders lay out.
func TestStructSizesMatchSchema(t *testing.T) {
	cases := []struct {
		name  string
		want  int
		build func(b *flatbuffers.Builder) flatbuffers.UOffsetT
	}{
		{"RequestHeader", RequestSize, func(b *flatbuffers.Builder) flatbuffers.UOffsetT {
			return fb.CreateRequestHeader(b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
		}},
		{"ResponseHeader", ResponseSize, func(b *flatbuffers.Builder) flatbuffers.UOffsetT {
			return fb.CreateResponseHeader(b, 1, 2, 3, 4, 5, 6, 7, 8)
		}},
		{"BatchItem", BatchItemSize, func(b *flatbuffers.Builder) flatbuffers.UOffsetT {
			return fb.CreateBatchItem(b, 1, 2, 3, 4, 5, 6, 7, 8)
		}},
		{"BatchResult", BatchResultSize, func(b *flatbuffers.Builder) flatbuffers.UOffsetT {
			return fb.CreateBatchResult(b, 1, 2, 3, 4, 5, 6)
		}},
	}
	for _, c := range cases {
		b := flatbuffers.NewBuilder(0)
		c.build(b)
		if got := int(b.Offset()); got != c.want {
			t.Errorf("%s: builder laid out %d bytes, constant says %d", c.name, got, c.want)
		}
	}
}

// Encode must produce the same bytes as the generated builder (same field order/offsets).
func TestRequestEncodeMatchesBuilder(t *testing.T) {
	r := Request{Op: fb.OpGet, Flags: FlagCap, Count: 7, Tenant: 0x1122334455667788,
		ID: identity.ObjectID{Hi: 0xA1A2A3A4A5A6A7A8, Lo: 0xB1B2B3B4B5B6B7B8}, Offset: 9, Length: 10, PayloadLen: 11}
	var mine [RequestSize]byte
	r.Encode(mine[:])
	b := flatbuffers.NewBuilder(0)
	b.Finish(fb.CreateRequestHeader(b, Magic, byte(fb.OpGet), FlagCap, ProtocolVersion, 7, 0,
		r.Tenant, r.ID.Hi, r.ID.Lo, 9, 10, 11))
	fin := b.FinishedBytes()
	built := fin[len(fin)-RequestSize:] // the struct is the tail; before it: root offset + alignment
	if diff := cmp.Diff(built, mine[:]); diff != "" {
		t.Fatalf("Encode differs from builder (-builder +Encode):\n%s", diff)
	}
}

func TestRoundTrips(t *testing.T) {
	r := Request{Op: fb.OpBatchGet, Flags: FlagExact, Version: ProtocolVersion, Count: 3, Tenant: 42,
		ID: identity.ObjectID{Hi: 1, Lo: 2}, Offset: 3, Length: 4, PayloadLen: 3 * BatchItemSize}
	var b [RequestSize]byte
	r.Encode(b[:])
	got, err := DecodeRequest(b[:])
	if err != nil || got != r {
		t.Fatalf("request round trip: %+v %v", got, err)
	}
	resp := Response{Op: fb.OpGet, Status: fb.StatusNotFound, Count: 1, ValueLen: 5, PayloadLen: 6}
	var rb [ResponseSize]byte
	resp.Encode(rb[:])
	if g, err := DecodeResponse(rb[:]); err != nil || g != resp {
		t.Fatalf("response round trip: %+v %v", g, err)
	}
	it := BatchItem{ID: identity.ObjectID{Hi: 7, Lo: 8}, Offset: 1, Length: 2, Flags: FlagCap}
	var ib [BatchItemSize]byte
	it.Encode(ib[:])
	if g, err := DecodeBatchItem(ib[:]); err != nil || g != it {
		t.Fatalf("item round trip: %+v %v", g, err)
	}
	br := BatchResult{Status: fb.StatusOk, Flags: ResultLeased, ValueLen: 9, PayloadLen: 0}
	var bb [BatchResultSize]byte
	br.Encode(bb[:])
	if g, err := DecodeBatchResult(bb[:]); err != nil || g != br {
		t.Fatalf("result round trip: %+v %v", g, err)
	}
	h := Hello{ProtocolVersion: 1, MinProtocolVersion: 1, MaxValueBytes: 64 << 20, MaxBatchItems: 4096, MaxDepth: 8, SoftwareVersion: "x", Transport: "tcp"}
	if g, err := DecodeHello(EncodeHello(h)); err != nil || g != h {
		t.Fatalf("hello round trip: %+v %v", g, err)
	}
	st := map[string]float64{"a": 1, "b": 2.5}
	if g, err := DecodeStats(EncodeStats(st)); err != nil || !cmp.Equal(g, st) {
		t.Fatalf("stats round trip: %v %v", g, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	var b [RequestSize]byte
	if _, err := DecodeRequest(b[:10]); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
	if _, err := DecodeRequest(b[:]); !errors.Is(err, ErrBadMagic) {
		t.Errorf("zero prefix: %v", err)
	}
	r := Request{Op: fb.OpPing, Version: 9}
	r.Encode(b[:])
	if _, err := DecodeRequest(b[:]); !errors.Is(err, ErrVersion) {
		t.Errorf("version: %v", err)
	}
	bad := BatchResult{Status: fb.StatusOk}
	var bb [BatchResultSize]byte
	bad.Encode(bb[:])
	bb[1] = 0x80 // a result flag this build does not know
	if _, err := DecodeBatchResult(bb[:]); !errors.Is(err, ErrMalformed) {
		t.Errorf("unknown result flag: %v", err)
	}
	if _, err := DecodeHello([]byte{1, 2, 3}); !errors.Is(err, ErrMalformed) {
		t.Errorf("hello garbage: %v", err)
	}
	if _, err := DecodeStats([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Errorf("stats garbage: %v", err)
	}
	if _, err := Negotiate(Hello{ProtocolVersion: 1, MinProtocolVersion: 1}, Hello{ProtocolVersion: 3, MinProtocolVersion: 2}); !errors.Is(err, ErrVersion) {
		t.Errorf("negotiate: %v", err)
	}
}

func TestLimitsCheck(t *testing.T) {
	l := DefaultLimits()
	cases := []struct {
		name   string
		r      Request
		ok     bool
		resync bool
	}{
		{"ping", Request{Op: fb.OpPing}, true, false},
		{"ping with payload", Request{Op: fb.OpPing, PayloadLen: 1}, false, true},
		{"put", Request{Op: fb.OpPut, PayloadLen: 1}, true, false},
		{"put empty", Request{Op: fb.OpPut}, false, true},
		{"put max", Request{Op: fb.OpPut, PayloadLen: l.MaxValue}, true, false},
		{"put oversized", Request{Op: fb.OpPut, PayloadLen: l.MaxValue + 1}, false, true},
		{"put beyond frame cap", Request{Op: fb.OpPut, PayloadLen: l.MaxFrame + 1}, false, false},
		{"get", Request{Op: fb.OpGet}, true, false},
		{"get exact+cap", Request{Op: fb.OpGet, Flags: FlagExact | FlagCap}, false, true},
		{"get unknown flag", Request{Op: fb.OpGet, Flags: 0x80}, false, true},
		{"exist with payload", Request{Op: fb.OpExist, PayloadLen: 8}, false, true},
		{"unknown op", Request{Op: 200}, false, true},
		{"op zero", Request{Op: fb.OpInvalid}, false, true},
		{"batch get", Request{Op: fb.OpBatchGet, Count: 2, PayloadLen: 2 * BatchItemSize}, true, false},
		{"batch get zero items", Request{Op: fb.OpBatchGet}, false, true},
		{"batch get too many", Request{Op: fb.OpBatchGet, Count: l.MaxBatchItems + 1, PayloadLen: uint64(l.MaxBatchItems+1) * BatchItemSize}, false, true},
		{"batch get wrong payload", Request{Op: fb.OpBatchGet, Count: 2, PayloadLen: 79}, false, true},
		{"batch exist lease", Request{Op: fb.OpBatchExistLease, Count: 2, Length: 5000, PayloadLen: 2 * BatchItemSize}, true, false},
		{"batch exist lease wrong payload", Request{Op: fb.OpBatchExistLease, Count: 2, PayloadLen: 81}, false, true},
		{"batch put", Request{Op: fb.OpBatchPut, Count: 1, PayloadLen: BatchItemSize + 1}, true, false},
		{"batch put short", Request{Op: fb.OpBatchPut, Count: 2, PayloadLen: BatchItemSize + 1}, false, true},
		{"sg put", Request{Op: fb.OpSgPut, Count: 2, PayloadLen: 16 + 5}, true, false},
		{"sg put no data", Request{Op: fb.OpSgPut, Count: 2, PayloadLen: 16}, false, true},
		{"sg get", Request{Op: fb.OpSgGet, Count: 2, PayloadLen: 16}, true, false},
		{"sg too many segs", Request{Op: fb.OpSgGet, Count: l.MaxSgSegs + 1, PayloadLen: uint64(l.MaxSgSegs+1) * 8}, false, true},
		{"rdma bootstrap", Request{Op: fb.OpRdmaBootstrap}, true, false},
		{"rdma bootstrap with payload", Request{Op: fb.OpRdmaBootstrap, PayloadLen: 3}, false, true},
		{"hello", Request{Op: fb.OpHello, PayloadLen: 100}, true, false},
		{"hello huge", Request{Op: fb.OpHello, PayloadLen: l.MaxControl + 1}, false, true},
	}
	for _, c := range cases {
		err := l.Check(&c.r)
		if (err == nil) != c.ok {
			t.Errorf("%s: err=%v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || fe.Resync != c.resync {
				t.Errorf("%s: %v resync=%v want %v", c.name, err, fe != nil && fe.Resync, c.resync)
			}
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatal(err)
	}
	l := DefaultLimits()
	l.MaxFrame = l.MaxValue
	if l.Validate() == nil {
		t.Error("frame cap below max value accepted")
	}
	l = DefaultLimits()
	l.MaxValue = 0
	if l.Validate() == nil {
		t.Error("zero max value accepted")
	}
}

func TestSgSegs(t *testing.T) {
	var b [24]byte
	PutSgSegs(b[:], []uint64{1, 2, 3})
	segs, total, err := DecodeSgSegs(b[:], 3, 100)
	if err != nil || total != 6 || !cmp.Equal(segs, []uint64{1, 2, 3}) {
		t.Fatalf("%v %d %v", segs, total, err)
	}
	if _, _, err := DecodeSgSegs(b[:], 3, 5); !errors.Is(err, ErrLimit) {
		t.Errorf("over max: %v", err)
	}
	PutSgSegs(b[:], []uint64{1, 0, 3})
	if _, _, err := DecodeSgSegs(b[:], 3, 100); !errors.Is(err, ErrLimit) {
		t.Errorf("zero segment: %v", err)
	}
	if _, _, err := DecodeSgSegs(b[:8], 3, 100); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
}

func TestHelloToken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{{"none", "", true}, {"short", "tok", true}, {"binary", "a\x00b\xff", true},
		{"max", string(make([]byte, MaxTokenLen)), true}, {"too long", string(make([]byte, MaxTokenLen+1)), false}} {
		t.Run(tc.name, func(t *testing.T) {
			in := Hello{ProtocolVersion: 1, MinProtocolVersion: 1, Transport: "tcp", Token: tc.token}
			got, err := DecodeHello(EncodeHello(in))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && got != in {
				t.Fatalf("got %+v, want %+v", got, in)
			}
		})
	}
}

func TestForbiddenStatusDecodes(t *testing.T) {
	var b [ResponseSize]byte
	(&Response{Op: fb.OpGet, Status: fb.StatusForbidden}).Encode(b[:])
	r, err := DecodeResponse(b[:])
	if err != nil || r.Status != fb.StatusForbidden {
		t.Fatalf("forbidden reply: %+v %v", r, err)
	}
	b[5] = byte(MaxStatus) + 1
	if _, err := DecodeResponse(b[:]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("status beyond MaxStatus: %v", err)
	}
}
