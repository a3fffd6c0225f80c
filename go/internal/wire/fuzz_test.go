package wire

import (
	"testing"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Every decoder gets a fuzz target. Seeds live in testdata/fuzz/<Target>/ (valid frames
// plus the shapes that once mattered); CI runs each target for a few seconds.

func FuzzDecodeRequest(f *testing.F) {
	var b [RequestSize]byte
	(&Request{Op: fb.OpPut, PayloadLen: 4096}).Encode(b[:])
	f.Add(b[:])
	(&Request{Op: fb.OpBatchGet, Count: 2, PayloadLen: 80}).Encode(b[:])
	f.Add(b[:])
	f.Add([]byte("DFK1"))
	l := DefaultLimits()
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			return
		}
		if cerr := l.Check(&r); cerr == nil {
			// Accepted frames must respect the limits the server relies on.
			if r.PayloadLen > l.MaxFrame || (r.Op == fb.OpPut && (r.PayloadLen == 0 || r.PayloadLen > l.MaxValue)) {
				t.Fatalf("limits accepted %+v", r)
			}
		}
		var out [RequestSize]byte
		r.Encode(out[:])
		r2, err := DecodeRequest(out[:])
		if err != nil || r2 != r {
			t.Fatalf("re-encode mismatch: %+v vs %+v (%v)", r, r2, err)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	var b [ResponseSize]byte
	(&Response{Op: fb.OpGet, Status: fb.StatusOk, ValueLen: 10, PayloadLen: 10}).Encode(b[:])
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResponse(data)
		if err != nil {
			return
		}
		var out [ResponseSize]byte
		r.Encode(out[:])
		if r2, err := DecodeResponse(out[:]); err != nil || r2 != r {
			t.Fatalf("re-encode mismatch")
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	var b [BatchItemSize]byte
	(&BatchItem{ID: identity.ObjectID{Hi: 1, Lo: 2}, Length: 3, Flags: FlagExact}).Encode(b[:])
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		if it, err := DecodeBatchItem(data); err == nil {
			var out [BatchItemSize]byte
			it.Encode(out[:])
			if it2, err := DecodeBatchItem(out[:]); err != nil || it2 != it {
				t.Fatalf("item re-encode mismatch")
			}
		}
		if r, err := DecodeBatchResult(data); err == nil {
			var out [BatchResultSize]byte
			r.Encode(out[:])
			if r2, err := DecodeBatchResult(out[:]); err != nil || r2 != r {
				t.Fatalf("result re-encode mismatch")
			}
		}
		_, _, _ = DecodeSgSegs(data, len(data)/SgSegSize, 1<<26)
	})
}

func FuzzDecodeControl(f *testing.F) {
	f.Add(EncodeHello(Hello{ProtocolVersion: 1, MinProtocolVersion: 1, SoftwareVersion: "v", Transport: "tcp"}))
	f.Add(EncodeStats(map[string]float64{"x": 1, "y": 2}))
	f.Add([]byte{8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := DecodeHello(data); err == nil {
			if _, err := DecodeHello(EncodeHello(h)); err != nil {
				t.Fatalf("re-encoded hello fails: %v", err)
			}
		}
		_, _ = DecodeStats(data)
	})
}

func FuzzDecodeMds(f *testing.F) {
	m := &Member{ID: "n1", Addr: "127.0.0.1:1", Weight: 2, Eligible: true, Config: []KV{{"engine", "slab"}}, Rails: []Rail{{Device: "d", QueryOK: true}}}
	f.Add(EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: m}))
	f.Add(EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpRegisterClient, Group: "g", Client: &ClientInfo{ID: "c", Info: []KV{{"a", "b"}}}}))
	f.Add(EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpListTopology, Group: "g", KnownMembersEpoch: 3, WaitMS: 10000, KnownTopologyEpoch: 9}))
	f.Add(EncodeMdsResponse(&MdsResponse{WaitMS: 10000, LeaseTTLMS: 6000}))
	f.Add(EncodeMdsResponse(&MdsResponse{Topology: &Topology{MembersEpoch: 1, Members: []Member{*m}}}))
	f.Add(EncodeMdsResponse(&MdsResponse{Clients: []ClientInfo{{ID: "c"}}}))
	f.Add(EncodeMember(m))
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := DecodeMdsRequest(data); err == nil {
			if _, err := DecodeMdsRequest(EncodeMdsRequest(&r)); err != nil {
				t.Fatalf("re-encoded request fails: %v", err)
			}
		}
		if r, err := DecodeMdsResponse(data); err == nil {
			if _, err := DecodeMdsResponse(EncodeMdsResponse(&r)); err != nil {
				t.Fatalf("re-encoded response fails: %v", err)
			}
		}
		if m, err := DecodeMember(data); err == nil {
			if _, err := DecodeMember(EncodeMember(&m)); err != nil {
				t.Fatalf("re-encoded member fails: %v", err)
			}
		}
		_, _ = DecodeClientInfo(data)
	})
}

// FuzzDecodeHello covers every Hello field, the tenant token included: a decoded Hello
// re-encodes to the same value, and a token never comes back longer than MaxTokenLen.
func FuzzDecodeHello(f *testing.F) {
	f.Add(EncodeHello(Hello{ProtocolVersion: 1, MinProtocolVersion: 1, SoftwareVersion: "v", Transport: "tcp"}))
	f.Add(EncodeHello(Hello{ProtocolVersion: 1, MinProtocolVersion: 1, MaxValueBytes: 1 << 26, Transport: "tcp", Token: "tok-a"}))
	f.Add(EncodeHello(Hello{ProtocolVersion: 1, MinProtocolVersion: 1, Token: string(make([]byte, 300))}))
	f.Add([]byte{8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHello(data)
		if err != nil {
			return
		}
		if len(h.Token) > MaxTokenLen {
			t.Fatalf("accepted a %d-byte token", len(h.Token))
		}
		h2, err := DecodeHello(EncodeHello(h))
		if err != nil || h2 != h {
			t.Fatalf("re-encode mismatch: %+v vs %+v (%v)", h, h2, err)
		}
	})
}
