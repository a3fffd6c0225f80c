package dcp

import (
	"errors"
	"fmt"
	"unicode"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Magics of the two protocols ("DCP1", "DCP2" read as little-endian u32).
const (
	MagicV1 uint32 = 0x31504344
	MagicV2 uint32 = 0x32504344
)

// Protocol versions.
const (
	V1 uint32 = 1 // SEND/RECV
	V2 uint32 = 2 // one-sided
)

// SlotHeader is the bytes before a v2 PUT's payload in its slot: a dfkv request prefix.
const SlotHeader = wire.RequestSize

// SlotPayloadOffset is where a v2 PUT's payload starts in its slot: page aligned, so the
// server can hand the slot's payload to O_DIRECT writes as is.
const SlotPayloadOffset = 4096

var (
	// ErrMalformed: the tail is not a well-formed DcpTail table.
	ErrMalformed = errors.New("dcp: malformed tail")
	// ErrRefused: a field is out of range or inconsistent; the connection is refused.
	ErrRefused = errors.New("dcp: tail refused")
	// ErrFallbackV1: the server answered a v2 offer with v1. The client must not use this
	// connection; it opens a fresh one offering v1.
	ErrFallbackV1 = errors.New("dcp: server speaks v1 only; reconnect offering v1")
)

// Rail is one QP's connection metadata.
type Rail struct {
	Device string
	Port   uint8
	LID    uint16
	GID    verbs.GID
	// GIDType is GID's RoCE version (QpInfo.gid_type; Unknown from a peer that predates it).
	GIDType verbs.GIDType
	QPNum   uint32
	PSN     uint32
	MTU     uint32
}

// Endpoint converts the rail to the verbs endpoint to connect to.
func (r Rail) Endpoint() verbs.Endpoint {
	return verbs.Endpoint{QPNum: r.QPNum, PSN: r.PSN, GID: r.GID, GIDType: r.GIDType, LID: r.LID, Port: r.Port, MTU: r.MTU}
}

// Segment is a lease of a registered receive segment: Slots slots of SlotBytes at Addr.
type Segment struct {
	Addr      uint64
	RKey      uint32
	Length    uint64
	SlotBytes uint64
	Slots     uint32
}

// Notify is the sender's native notification QP (on the device and port of Rails[0]); nil
// in a tail from a peer without native notifications.
type Notify struct {
	QPNum       uint32
	PSN         uint32
	RecvCredits uint32 // notifications the sender takes in flight
	MaxMsg      uint32 // largest notification (name + body) the sender accepts
}

// Notification limits a tail may declare.
const (
	MaxNotifyCredits = 4096
	MaxNotifyMsg     = 1 << 20
)

// Tail is a decoded DcpTail.
type Tail struct {
	Version    uint32
	MaxBlock   uint64
	Depth      uint32
	MaxTargets uint32
	Rails      []Rail
	Segments   []Segment
	Notify     *Notify
	// DeviceTargets (v2): in an offer, the client may name device-memory (DMA-BUF) GET
	// targets; in an answer, the server accepts them. A server older than the field never
	// sets it.
	DeviceTargets bool
}

// Limits bound what a peer may declare.
type Limits struct {
	MaxBlock   uint64
	MaxDepth   uint32
	MaxTargets uint32
	MaxRails   int
}

// MaxTailBytes bounds an encoded tail (64 rails and segments fit in a few KiB): larger
// input is refused before any parsing, as the bootstrap frame that carries it is.
const MaxTailBytes = 64 << 10

// DefaultLimits match the server's default value cap (64 MiB).
var DefaultLimits = Limits{MaxBlock: 64 << 20, MaxDepth: 1024, MaxTargets: 256, MaxRails: 8}

// SlotSize is the v2 slot for a declared max block:
// align4K(4096 + header + max(block, 4096)).
func SlotSize(maxBlock uint64) uint64 {
	n := 4096 + SlotHeader + max(maxBlock, 4096)
	return (n + 4095) &^ 4095
}

// Encode builds the DcpTail table, with the magic that names t.Version.
func Encode(t Tail) []byte {
	magic := MagicV1
	if t.Version == V2 {
		magic = MagicV2
	}
	return encode(t, magic)
}

func encode(t Tail, magic uint32) []byte {
	b := flatbuffers.NewBuilder(256)
	rails := make([]flatbuffers.UOffsetT, len(t.Rails))
	for i, r := range t.Rails {
		dev := b.CreateString(r.Device)
		gid := b.CreateByteVector(r.GID[:])
		fb.QpInfoStart(b)
		fb.QpInfoAddDevice(b, dev)
		fb.QpInfoAddPort(b, r.Port)
		fb.QpInfoAddLid(b, r.LID)
		fb.QpInfoAddGid(b, gid)
		fb.QpInfoAddQpNum(b, r.QPNum)
		fb.QpInfoAddPsn(b, r.PSN)
		fb.QpInfoAddMtu(b, r.MTU)
		if r.GIDType != verbs.GIDTypeUnknown {
			fb.QpInfoAddGidType(b, uint8(r.GIDType))
		}
		rails[i] = fb.QpInfoEnd(b)
	}
	segs := make([]flatbuffers.UOffsetT, len(t.Segments))
	for i, s := range t.Segments {
		fb.RecvSegmentStart(b)
		fb.RecvSegmentAddAddr(b, s.Addr)
		fb.RecvSegmentAddRkey(b, s.RKey)
		fb.RecvSegmentAddLength(b, s.Length)
		fb.RecvSegmentAddSlotBytes(b, s.SlotBytes)
		fb.RecvSegmentAddSlots(b, s.Slots)
		segs[i] = fb.RecvSegmentEnd(b)
	}
	vec := func(start func(*flatbuffers.Builder, int) flatbuffers.UOffsetT, offs []flatbuffers.UOffsetT) flatbuffers.UOffsetT {
		start(b, len(offs))
		for i := len(offs) - 1; i >= 0; i-- {
			b.PrependUOffsetT(offs[i])
		}
		return b.EndVector(len(offs))
	}
	rv := vec(fb.DcpTailStartRailsVector, rails)
	sv := vec(fb.DcpTailStartSegmentsVector, segs)
	var nt flatbuffers.UOffsetT
	if n := t.Notify; n != nil {
		fb.NotifyInfoStart(b)
		fb.NotifyInfoAddQpNum(b, n.QPNum)
		fb.NotifyInfoAddPsn(b, n.PSN)
		fb.NotifyInfoAddRecvCredits(b, n.RecvCredits)
		fb.NotifyInfoAddMaxMsg(b, n.MaxMsg)
		nt = fb.NotifyInfoEnd(b)
	}
	fb.DcpTailStart(b)
	// Force the magic even when it equals the schema default, so it is always on the wire.
	b.PrependUint32(magic)
	b.Slot(0)
	fb.DcpTailAddProtocolVersion(b, t.Version)
	fb.DcpTailAddMaxBlock(b, t.MaxBlock)
	fb.DcpTailAddDepth(b, t.Depth)
	fb.DcpTailAddRails(b, rv)
	fb.DcpTailAddSegments(b, sv)
	fb.DcpTailAddMaxTargets(b, t.MaxTargets)
	if nt != 0 {
		fb.DcpTailAddNotify(b, nt)
	}
	if t.DeviceTargets {
		fb.DcpTailAddDeviceTargets(b, true)
	}
	b.Finish(fb.DcpTailEnd(b))
	return b.FinishedBytes()
}

// decode parses the table without judging it; malformed input is an error, never a panic
// (wire.DecodeTable's guard, which also keeps every read inside buf).
func decode(buf []byte) (t Tail, magic uint32, err error) {
	if len(buf) > MaxTailBytes {
		return Tail{}, 0, fmt.Errorf("%w: tail of %d bytes (max %d)", ErrRefused, len(buf), MaxTailBytes)
	}
	err = wire.DecodeTable(buf, func(buf []byte) error {
		x := fb.GetRootAsDcpTail(buf, 0)
		magic = x.Magic()
		t = Tail{Version: x.ProtocolVersion(), MaxBlock: x.MaxBlock(), Depth: x.Depth(), MaxTargets: x.MaxTargets(),
			DeviceTargets: x.DeviceTargets()}
		if x.RailsLength() > 64 || x.SegmentsLength() > 64 || x.OptionsLength() > 64 {
			return fmt.Errorf("%w: %d rails, %d segments, %d options", ErrRefused, x.RailsLength(), x.SegmentsLength(), x.OptionsLength())
		}
		var q fb.QpInfo
		for i := range x.RailsLength() {
			if !x.Rails(&q, i) {
				return fmt.Errorf("%w: rail %d", ErrMalformed, i)
			}
			r := Rail{Device: string(q.Device()), Port: q.Port(), LID: q.Lid(), QPNum: q.QpNum(), PSN: q.Psn(), MTU: q.Mtu(),
				GIDType: verbs.GIDType(q.GidType())}
			if n := q.GidLength(); n != 16 {
				return fmt.Errorf("%w: rail %d GID of %d bytes", ErrRefused, i, n)
			}
			copy(r.GID[:], q.GidBytes())
			t.Rails = append(t.Rails, r)
		}
		var s fb.RecvSegment
		for i := range x.SegmentsLength() {
			if !x.Segments(&s, i) {
				return fmt.Errorf("%w: segment %d", ErrMalformed, i)
			}
			t.Segments = append(t.Segments, Segment{Addr: s.Addr(), RKey: s.Rkey(), Length: s.Length(), SlotBytes: s.SlotBytes(), Slots: s.Slots()})
		}
		if n := x.Notify(nil); n != nil {
			t.Notify = &Notify{QPNum: n.QpNum(), PSN: n.Psn(), RecvCredits: n.RecvCredits(), MaxMsg: n.MaxMsg()}
		}
		return nil
	})
	if errors.Is(err, wire.ErrMalformed) {
		err = fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err != nil {
		return Tail{}, 0, err
	}
	return t, magic, nil
}

func refuse(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
}

// checkCommon validates what every tail carries.
func checkCommon(t Tail, magic uint32, lim Limits) error {
	switch {
	case magic == MagicV1 && t.Version == V1, magic == MagicV2 && t.Version == V2:
	default:
		return refuse("magic %#x with protocol version %d", magic, t.Version)
	}
	if t.Depth == 0 || t.Depth > lim.MaxDepth {
		return refuse("depth %d (1..%d)", t.Depth, lim.MaxDepth)
	}
	if t.MaxBlock == 0 || t.MaxBlock > lim.MaxBlock {
		return refuse("max block %d (1..%d)", t.MaxBlock, lim.MaxBlock)
	}
	if len(t.Rails) == 0 || len(t.Rails) > lim.MaxRails {
		return refuse("%d rails (1..%d)", len(t.Rails), lim.MaxRails)
	}
	for i, r := range t.Rails {
		if r.Device == "" || len(r.Device) > 64 || !printable(r.Device) {
			return refuse("rail %d device name %q (%d bytes)", i, clip(r.Device, 64), len(r.Device))
		}
		if r.Port == 0 {
			return refuse("rail %d port 0", i)
		}
		if r.QPNum == 0 || r.QPNum > 1<<24-1 || r.PSN > 1<<24-1 {
			return refuse("rail %d qp %d psn %d (24 bits, qp > 0)", i, r.QPNum, r.PSN)
		}
		switch r.MTU {
		case 256, 512, 1024, 2048, 4096:
		default:
			return refuse("rail %d mtu %d", i, r.MTU)
		}
		if r.GID.IsZero() && r.LID == 0 {
			return refuse("rail %d has neither GID nor LID", i)
		}
		if r.GIDType > verbs.GIDTypeRoCEv2 {
			return refuse("rail %d gid type %d (0..2)", i, r.GIDType)
		}
	}
	if n := t.Notify; n != nil {
		switch {
		case n.QPNum == 0 || n.QPNum > 1<<24-1 || n.PSN > 1<<24-1:
			return refuse("notify qp %d psn %d (24 bits, qp > 0)", n.QPNum, n.PSN)
		case n.RecvCredits == 0 || n.RecvCredits > MaxNotifyCredits:
			return refuse("notify credits %d (1..%d)", n.RecvCredits, MaxNotifyCredits)
		case n.MaxMsg == 0 || n.MaxMsg > MaxNotifyMsg:
			return refuse("notify max message %d (1..%d)", n.MaxMsg, MaxNotifyMsg)
		}
	}
	if t.Version == V1 {
		if t.MaxTargets != 0 || len(t.Segments) != 0 {
			return refuse("v1 tail with %d targets and %d segments", t.MaxTargets, len(t.Segments))
		}
	} else if t.MaxTargets == 0 || t.MaxTargets > lim.MaxTargets {
		return refuse("max targets %d (1..%d)", t.MaxTargets, lim.MaxTargets)
	}
	return nil
}

// clip bounds what an error message quotes of a peer's string.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func printable(s string) bool {
	for _, c := range s {
		if c > unicode.MaxASCII || !unicode.IsPrint(c) || c == ' ' {
			return false
		}
	}
	return true
}

// DecodeOffer parses and validates a client's offer (server side).
func DecodeOffer(buf []byte, lim Limits) (Tail, error) {
	t, magic, err := decode(buf)
	if err != nil {
		return Tail{}, err
	}
	if err := checkCommon(t, magic, lim); err != nil {
		return Tail{}, err
	}
	if len(t.Segments) != 0 {
		return Tail{}, refuse("offer carries %d segments", len(t.Segments))
	}
	return t, nil
}

// Protocol picks the server's protocol for an offer.
func Protocol(offer Tail, forceV1 bool) uint32 {
	if offer.Version == V2 && !forceV1 {
		return V2
	}
	return V1
}

// DecodeAnswer parses and validates the server's answer to offer (client side). An answer
// that downgrades a v2 offer returns ErrFallbackV1 (with the decoded answer).
func DecodeAnswer(buf []byte, offer Tail, lim Limits) (Tail, error) {
	t, magic, err := decode(buf)
	if err != nil {
		return Tail{}, err
	}
	if err := checkCommon(t, magic, lim); err != nil {
		return Tail{}, err
	}
	if t.Version > offer.Version {
		return Tail{}, refuse("answer v%d to a v%d offer", t.Version, offer.Version)
	}
	if t.Depth > offer.Depth {
		return Tail{}, refuse("answer depth %d above the offered %d", t.Depth, offer.Depth)
	}
	if t.Notify != nil && offer.Notify == nil {
		return Tail{}, refuse("answer carries a notification QP the offer did not ask for")
	}
	if t.DeviceTargets && (!offer.DeviceTargets || t.Version != V2) {
		return Tail{}, refuse("answer v%d accepts device targets the offer did not ask for", t.Version)
	}
	if offer.Version == V2 && t.Version == V1 {
		return t, ErrFallbackV1
	}
	if a, o := t.Rails[0].GIDType, offer.Rails[0].GIDType; a != verbs.GIDTypeUnknown && o != verbs.GIDTypeUnknown && a != o {
		// Packets of one RoCE version are dropped by a QP of the other: fail here, not at a
		// transport timeout.
		return Tail{}, refuse("answer GID %s is %s, the offer's %s is %s", t.Rails[0].GID, a, offer.Rails[0].GID, o)
	}
	if t.Version == V2 {
		// A server that accepts device targets may grant more targets than offered (up to
		// the client's limit): the offer keeps its old value so older servers, which refuse
		// offers above their own limit, still accept it; a direct load names one target per
		// layer piece.
		maxT := offer.MaxTargets
		if t.DeviceTargets {
			maxT = max(maxT, lim.MaxTargets)
		}
		if t.MaxBlock != offer.MaxBlock || t.MaxTargets > maxT {
			return Tail{}, refuse("answer geometry block %d targets %d for offer block %d targets %d",
				t.MaxBlock, t.MaxTargets, offer.MaxBlock, offer.MaxTargets)
		}
		if len(t.Segments) != 1 {
			return Tail{}, refuse("v2 answer with %d segments (want 1)", len(t.Segments))
		}
		s := t.Segments[0]
		want := SlotSize(t.MaxBlock)
		switch {
		case s.SlotBytes != want:
			return Tail{}, refuse("slot of %d bytes, want %d for block %d", s.SlotBytes, want, t.MaxBlock)
		case s.Slots != t.Depth:
			return Tail{}, refuse("%d slots for depth %d", s.Slots, t.Depth)
		case s.Length != uint64(s.Slots)*s.SlotBytes:
			return Tail{}, refuse("segment length %d != %d slots x %d", s.Length, s.Slots, s.SlotBytes)
		case s.Addr == 0 || s.RKey == 0 || s.Addr+s.Length < s.Addr:
			return Tail{}, refuse("segment addr %#x rkey %#x length %d", s.Addr, s.RKey, s.Length)
		}
	}
	return t, nil
}
