package dcp

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/internal/testutil"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

func rail() Rail {
	return Rail{Device: "mlx5_0", Port: 1, GID: verbs.GID{0xfe, 0x80, 15: 2}, QPNum: 0x1234, PSN: 77, MTU: 4096}
}

func offerV2() Tail {
	return Tail{Version: V2, MaxBlock: 1 << 20, Depth: 8, MaxTargets: 16, Rails: []Rail{rail()}}
}

func answerV2(o Tail) Tail {
	slot := SlotSize(o.MaxBlock)
	a := o
	a.Rails = []Rail{{Device: "soft0", Port: 1, GID: verbs.GID{0xfe, 0x80, 15: 3}, QPNum: 0x99, PSN: 5, MTU: 4096}}
	a.Segments = []Segment{{Addr: 0x7f0000000000, RKey: 0x1100, Length: slot * uint64(o.Depth), SlotBytes: slot, Slots: o.Depth}}
	return a
}

func TestSlotSize(t *testing.T) {
	for _, c := range []struct{ block, want uint64 }{
		{1, 12288}, {4096, 12288}, {4097, 12288}, {8192 - 64, 12288}, {8192, 16384}, {1 << 20, 1<<20 + 8192},
	} {
		if got := SlotSize(c.block); got != c.want {
			t.Errorf("SlotSize(%d) = %d, want %d", c.block, got, c.want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	o := offerV2()
	got, err := DecodeOffer(Encode(o), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(o, got); diff != "" {
		t.Fatal(diff)
	}
	a := answerV2(o)
	gotA, err := DecodeAnswer(Encode(a), o, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, gotA); diff != "" {
		t.Fatal(diff)
	}
	v1 := Tail{Version: V1, MaxBlock: 1 << 20, Depth: 4, Rails: []Rail{rail()}}
	if _, err := DecodeOffer(Encode(v1), DefaultLimits); err != nil {
		t.Fatalf("v1 offer: %v", err)
	}
}

// The GID's RoCE version travels both ways; a tail without it (a peer from before) reads
// as Unknown and is not checked against the other side's.
func TestGIDType(t *testing.T) {
	o := offerV2()
	o.Rails[0].GIDType = verbs.GIDTypeRoCEv2
	got, err := DecodeOffer(Encode(o), DefaultLimits)
	if err != nil || got.Rails[0].GIDType != verbs.GIDTypeRoCEv2 {
		t.Fatalf("offer gid type %v: %v", got.Rails, err)
	}
	a := answerV2(o)
	a.Rails[0].GIDType = verbs.GIDTypeRoCEv2
	if gotA, err := DecodeAnswer(Encode(a), o, DefaultLimits); err != nil || gotA.Rails[0].Endpoint().GIDType != verbs.GIDTypeRoCEv2 {
		t.Fatalf("answer %v: %v", gotA.Rails, err)
	}
	legacy := answerV2(o) // no type: accepted whatever the offer said
	if gotA, err := DecodeAnswer(Encode(legacy), o, DefaultLimits); err != nil || gotA.Rails[0].GIDType != verbs.GIDTypeUnknown {
		t.Fatalf("legacy answer %v: %v", gotA.Rails, err)
	}
}

func TestNegotiation(t *testing.T) {
	o := offerV2()
	if Protocol(o, false) != V2 || Protocol(o, true) != V1 {
		t.Fatal("server protocol choice")
	}
	v1 := Tail{Version: V1, MaxBlock: o.MaxBlock, Depth: o.Depth, Rails: []Rail{rail()}}
	if Protocol(v1, false) != V1 {
		t.Fatal("v1 offer answered v2")
	}
	// A forced-v1 server answers a v2 offer with v1: the client must reconnect, not reuse.
	if _, err := DecodeAnswer(Encode(v1), o, DefaultLimits); !errors.Is(err, ErrFallbackV1) {
		t.Fatalf("downgraded answer: %v", err)
	}
	// A v1 offer answered v1 is fine.
	if _, err := DecodeAnswer(Encode(v1), v1, DefaultLimits); err != nil {
		t.Fatal(err)
	}
}

// Every bad tail is refused with a clear error; nothing panics.
func TestBadTails(t *testing.T) {
	o := offerV2()
	offers := map[string]func(t *Tail) []byte{
		"v2 magic with version 1": func(t *Tail) []byte { t.Version = V1; return encode(*t, MagicV2) },
		"v1 magic with version 2": func(t *Tail) []byte { return encode(*t, MagicV1) },
		"unknown magic":           func(t *Tail) []byte { return encode(*t, 0x33504344) },
		"version 3":               func(t *Tail) []byte { t.Version = 3; return encode(*t, MagicV2) },
		"depth 0":                 func(t *Tail) []byte { t.Depth = 0; return Encode(*t) },
		"depth too deep":          func(t *Tail) []byte { t.Depth = 1 << 20; return Encode(*t) },
		"block 0":                 func(t *Tail) []byte { t.MaxBlock = 0; return Encode(*t) },
		"block too big":           func(t *Tail) []byte { t.MaxBlock = 1 << 40; return Encode(*t) },
		"no rails":                func(t *Tail) []byte { t.Rails = nil; return Encode(*t) },
		"too many rails":          func(t *Tail) []byte { t.Rails = make([]Rail, 9); return Encode(*t) },
		"empty device":            func(t *Tail) []byte { t.Rails[0].Device = ""; return Encode(*t) },
		"device with newline":     func(t *Tail) []byte { t.Rails[0].Device = "mlx5\n0"; return Encode(*t) },
		"port 0":                  func(t *Tail) []byte { t.Rails[0].Port = 0; return Encode(*t) },
		"qp 0":                    func(t *Tail) []byte { t.Rails[0].QPNum = 0; return Encode(*t) },
		"qp 25 bits":              func(t *Tail) []byte { t.Rails[0].QPNum = 1 << 24; return Encode(*t) },
		"psn 25 bits":             func(t *Tail) []byte { t.Rails[0].PSN = 1 << 24; return Encode(*t) },
		"mtu 1500":                func(t *Tail) []byte { t.Rails[0].MTU = 1500; return Encode(*t) },
		"no address":              func(t *Tail) []byte { t.Rails[0].GID = verbs.GID{}; return Encode(*t) },
		"gid type 3":              func(t *Tail) []byte { t.Rails[0].GIDType = 3; return Encode(*t) },
		"v2 without targets":      func(t *Tail) []byte { t.MaxTargets = 0; return Encode(*t) },
		"too many targets":        func(t *Tail) []byte { t.MaxTargets = 1 << 16; return Encode(*t) },
		"v1 with targets":         func(t *Tail) []byte { t.Version = V1; return Encode(*t) },
		"offer with a segment":    func(t *Tail) []byte { t.Segments = answerV2(*t).Segments; return Encode(*t) },
		"truncated":               func(t *Tail) []byte { b := Encode(*t); return b[:len(b)/2] },
		"empty":                   func(t *Tail) []byte { return nil },
		"garbage":                 func(t *Tail) []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") },
	}
	for name, mk := range offers {
		tl := offerV2()
		tl.Rails = append([]Rail(nil), tl.Rails...)
		b := mk(&tl)
		if _, err := DecodeOffer(b, DefaultLimits); !errors.Is(err, ErrRefused) && !errors.Is(err, ErrMalformed) {
			t.Errorf("offer %s: err %v", name, err)
		}
	}
	answers := map[string]func(a *Tail){
		"two segments": func(a *Tail) { a.Segments = append(a.Segments, a.Segments[0]) },
		"no segment":   func(a *Tail) { a.Segments = nil },
		"wrong slot size": func(a *Tail) {
			a.Segments[0].SlotBytes += 4096
			a.Segments[0].Length = a.Segments[0].SlotBytes * uint64(a.Depth)
		},
		"slots != depth":   func(a *Tail) { a.Segments[0].Slots++ },
		"short segment":    func(a *Tail) { a.Segments[0].Length -= 1 },
		"rkey 0":           func(a *Tail) { a.Segments[0].RKey = 0 },
		"addr 0":           func(a *Tail) { a.Segments[0].Addr = 0 },
		"wrapping segment": func(a *Tail) { a.Segments[0].Addr = ^uint64(0) - 10 },
		"deeper than offer": func(a *Tail) {
			a.Depth = o.Depth + 1
			a.Segments[0].Slots = a.Depth
			a.Segments[0].Length = uint64(a.Depth) * a.Segments[0].SlotBytes
		},
		"other block":        func(a *Tail) { a.MaxBlock = o.MaxBlock / 2 },
		"other RoCE version": func(a *Tail) { a.Rails[0].GIDType = verbs.GIDTypeIB },
		"more targets":       func(a *Tail) { a.MaxTargets = o.MaxTargets + 1 },
	}
	for name, mut := range answers {
		a := answerV2(o)
		a.Segments = append([]Segment(nil), a.Segments...)
		mut(&a)
		o := o
		o.Rails = []Rail{rail()}
		o.Rails[0].GIDType = verbs.GIDTypeRoCEv2
		if _, err := DecodeAnswer(Encode(a), o, DefaultLimits); !errors.Is(err, ErrRefused) {
			t.Errorf("answer %s: err %v", name, err)
		}
	}
	v1 := Tail{Version: V1, MaxBlock: 1 << 20, Depth: 4, Rails: []Rail{rail()}}
	if _, err := DecodeAnswer(Encode(answerV2(offerV2())), v1, DefaultLimits); !errors.Is(err, ErrRefused) {
		t.Errorf("v2 answer to a v1 offer: %v", err)
	}
}

// FuzzDecodeDcp feeds arbitrary bytes to the server's decoder (offers); an accepted offer
// must survive re-encoding. FuzzDecodeDcpAnswer does the client's. (The worker once grew
// past 1.5 GB and stalled, with a recorded input that passed on its own: the decoder read
// strings up to the input's capacity, the engine's 100 MB buffer, and quoted them in its
// errors. TestTailStaysInsideItsBytes holds that shut.)
func FuzzDecodeDcp(f *testing.F) {
	o := offerV2()
	f.Add(Encode(o))
	f.Add(Encode(Tail{Version: V1, MaxBlock: 1, Depth: 1, Rails: []Rail{rail()}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeOffer(b, DefaultLimits)
		if err != nil {
			return
		}
		again, err := DecodeOffer(Encode(got), DefaultLimits)
		if err != nil {
			t.Fatalf("accepted offer fails after re-encoding: %v", err)
		}
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatal(diff)
		}
	})
}

func FuzzDecodeDcpAnswer(f *testing.F) {
	o := offerV2()
	f.Add(Encode(answerV2(o)))
	f.Add(Encode(Tail{Version: V1, MaxBlock: 1, Depth: 1, Rails: []Rail{rail()}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, err := DecodeAnswer(b, o, DefaultLimits); err == nil && a.Version == V2 {
			s := a.Segments[0]
			if s.SlotBytes != SlotSize(a.MaxBlock) || s.Length != uint64(s.Slots)*s.SlotBytes {
				t.Fatalf("accepted answer with bad geometry %+v", a)
			}
		}
	})
}

// TestNotifyInfo: the notification QP survives the round trip in offers and answers, a tail
// without it decodes as a peer without native notifications, and bad fields are refused.
func TestNotifyInfo(t *testing.T) {
	o := offerV2()
	o.Notify = &Notify{QPNum: 0x42, PSN: 9, RecvCredits: 16, MaxMsg: 65528}
	got, err := DecodeOffer(Encode(o), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(o, got); diff != "" {
		t.Fatal(diff)
	}
	a := answerV2(o)
	a.Notify = &Notify{QPNum: 0x43, PSN: 1, RecvCredits: 8, MaxMsg: 4088}
	gotA, err := DecodeAnswer(Encode(a), o, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, gotA); diff != "" {
		t.Fatal(diff)
	}
	if got, err := DecodeOffer(Encode(offerV2()), DefaultLimits); err != nil || got.Notify != nil {
		t.Fatalf("offer without notify: %+v, %v", got.Notify, err)
	}
	// An answer may not bring a notification QP the offer did not ask for.
	if _, err := DecodeAnswer(Encode(a), offerV2(), DefaultLimits); !errors.Is(err, ErrRefused) {
		t.Fatalf("unasked notify answer: %v", err)
	}
	for name, n := range map[string]Notify{
		"qp 0":        {QPNum: 0, RecvCredits: 1, MaxMsg: 1},
		"qp 25 bits":  {QPNum: 1 << 24, RecvCredits: 1, MaxMsg: 1},
		"psn 25 bits": {QPNum: 1, PSN: 1 << 24, RecvCredits: 1, MaxMsg: 1},
		"no credits":  {QPNum: 1, MaxMsg: 1},
		"credits":     {QPNum: 1, RecvCredits: MaxNotifyCredits + 1, MaxMsg: 1},
		"no msg":      {QPNum: 1, RecvCredits: 1},
		"msg":         {QPNum: 1, RecvCredits: 1, MaxMsg: MaxNotifyMsg + 1},
	} {
		o := offerV2()
		o.Notify = &n
		if _, err := DecodeOffer(Encode(o), DefaultLimits); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}

// TestTailStaysInsideItsBytes: a device name whose length runs past the tail is malformed,
// also when the tail is a window of a larger buffer. Before the decoder clipped its input,
// such a name read the bytes after the tail (up to the fuzz engine's 100 MB input buffer,
// which is what stalled FuzzDecodeDcp's worker).
func TestTailStaysInsideItsBytes(t *testing.T) {
	o := offerV2()
	o.Rails[0].Device = "dev-name-0"
	frame := Encode(o)
	if _, err := DecodeOffer(frame, DefaultLimits); err != nil {
		t.Fatalf("intact tail: %v", err)
	}
	bad, err := testutil.OverrunString(frame, "dev-name-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeOffer(bad, DefaultLimits); !errors.Is(err, ErrMalformed) {
		t.Fatalf("device name running past the tail: err %v, want ErrMalformed", err)
	}
}

// A refusal quotes at most 64 bytes of a peer's device name.
func TestRefusalQuotesABoundedName(t *testing.T) {
	o := offerV2()
	o.Rails[0].Device = string(make([]byte, 4000))
	_, err := DecodeOffer(Encode(o), DefaultLimits)
	if !errors.Is(err, ErrRefused) || len(err.Error()) > 400 {
		t.Fatalf("err of %d bytes: %v", len(err.Error()), err)
	}
}
