package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Magic starts every request and response prefix: "DFK1" read as a little-endian u32.
const Magic uint32 = 0x314B4644

// ProtocolVersion is the version this build speaks. A peer sending another version is
// answered Invalid and disconnected (fail closed).
const ProtocolVersion uint16 = 1

// Sizes of the fixed FlatBuffers structs (checked against the generated builders in tests).
const (
	RequestSize     = 64
	ResponseSize    = 32
	BatchItemSize   = 40
	BatchResultSize = 24
	SgSegSize       = 8
)

// MaxStatus is the highest status this build knows; a larger one is ErrMalformed.
const MaxStatus = fb.StatusBusy

// MaxTokenLen bounds the tenant token carried in Hello and MdsRequest.
const MaxTokenLen = 4096

// Request flags (RequestHeader.flags and BatchItem.flags) for Get-like ops.
const (
	// FlagExact: the stored length must equal Length; otherwise the reply is Invalid with
	// ValueLen set and no payload.
	FlagExact uint8 = 1 << 0
	// FlagCap: Length is a capacity; a stored value longer than it is refused (Invalid with
	// ValueLen set), otherwise the whole value is returned.
	FlagCap uint8 = 1 << 1
	// FlagReplica addresses the node's hot-object replica table instead of its keys
	// (docs/ARCHITECTURE.md "Hot objects"): a Get or BatchGet item reads a replica (a miss
	// when the node holds no valid one), a Put from the key's primary stores one (Offset is
	// its generation, Length its lease in milliseconds), a Remove invalidates it (Offset is
	// the generation). Servers that predate it refuse the flag (Invalid), so a mixed
	// cluster fails closed.
	FlagReplica uint8 = 1 << 2
	knownFlags        = FlagExact | FlagCap | FlagReplica
)

// Hot is the hot-object hint a primary puts in the reserved word of a GET reply
// (ResponseHeader.reserved) or a BatchGet result (BatchResult.reserved2): the key is served
// by Replicas more nodes, the next distinct ring owners after the primary, for ValidMS
// more milliseconds; with SkipPrimary, readers spread over the replicas alone (the primary
// still answers a replica's miss). The zero value (what every older server sends) means
// "not hot".
type Hot struct {
	Replicas    uint8  // 0..127
	ValidMS     uint32 // 0..MaxHotValidMS
	SkipPrimary bool
}

// MaxHotValidMS is the longest window a hint can name (4.6 hours).
const MaxHotValidMS = 1<<24 - 1

// MaxHotReplicas is the most replicas a hint can name: a 128-node cluster can spread one
// key over every node.
const MaxHotReplicas = 127

// Word packs h into the reserved word: ValidMS<<8 | SkipPrimary<<7 | Replicas.
func (h Hot) Word() uint32 {
	if h.Replicas == 0 {
		return 0
	}
	w := min(h.ValidMS, MaxHotValidMS)<<8 | uint32(min(h.Replicas, MaxHotReplicas))
	if h.SkipPrimary {
		w |= 1 << 7
	}
	return w
}

// HotFromWord unpacks a reserved word.
// A word naming no replicas is "not hot" whatever its other bits hold, so decoding is the
// inverse of Word.
func HotFromWord(w uint32) Hot {
	if w&MaxHotReplicas == 0 {
		return Hot{}
	}
	return Hot{Replicas: uint8(w & MaxHotReplicas), ValidMS: w >> 8, SkipPrimary: w&(1<<7) != 0}
}

// ResultLeased (BatchResult.Flags) marks a BatchExistLease hit that holds a lease.
const ResultLeased uint8 = 1 << 0

// Lease durations of BatchExistLease (RequestHeader.length, in milliseconds).
const (
	DefaultLeaseMS = 10_000 // when the request asks for 0
	MaxLeaseMS     = 60_000 // longer requests are clamped: a lease must not outlive its use
)

// Op and Status are the generated enums; re-exported so callers need not import fb.
type (
	Op     = fb.Op
	Status = fb.Status
)

// Sentinel errors of the decoders.
var (
	// ErrShort: fewer bytes than a prefix needs.
	ErrShort = errors.New("wire: short buffer")
	// ErrBadMagic: the stream is out of sync or not dfkv; the connection must be closed.
	ErrBadMagic = errors.New("wire: bad magic")
	// ErrVersion: a protocol version this build does not speak.
	ErrVersion = errors.New("wire: unsupported protocol version")
	// ErrLimit: a frame breaks a configured limit.
	ErrLimit = errors.New("wire: frame exceeds limit")
	// ErrMalformed: a structurally invalid frame or control table.
	ErrMalformed = errors.New("wire: malformed frame")
	// ErrUnknownOp: an op this build does not implement.
	ErrUnknownOp = errors.New("wire: unknown op")
)

// Request is the decoded form of a RequestHeader.
type Request struct {
	Op         Op
	Flags      uint8
	Version    uint16
	Count      uint32
	Tenant     uint64
	ID         identity.ObjectID
	Offset     uint64
	Length     uint64
	PayloadLen uint64
}

// Encode writes the 64-byte prefix into b[:RequestSize]. Version 0 is sent as
// ProtocolVersion.
func (r *Request) Encode(b []byte) {
	_ = b[RequestSize-1]
	var h fb.RequestHeader
	h.Init(b, 0)
	v := r.Version
	if v == 0 {
		v = ProtocolVersion
	}
	h.MutateMagic(Magic)
	h.MutateOp(byte(r.Op))
	h.MutateFlags(r.Flags)
	h.MutateVersion(v)
	h.MutateCount(r.Count)
	h.MutateReserved(0)
	h.MutateTenant(r.Tenant)
	h.MutateIdHi(r.ID.Hi)
	h.MutateIdLo(r.ID.Lo)
	h.MutateOffset(r.Offset)
	h.MutateLength(r.Length)
	h.MutatePayloadLen(r.PayloadLen)
}

// DecodeRequest parses a prefix. It checks only framing (size, magic, version); the
// op-specific limits are checked by Limits.Check so that the caller can still skip the
// payload of a well-framed but unacceptable request.
func DecodeRequest(b []byte) (Request, error) {
	if len(b) < RequestSize {
		return Request{}, ErrShort
	}
	var h fb.RequestHeader
	h.Init(b, 0)
	if h.Magic() != Magic {
		return Request{}, ErrBadMagic
	}
	r := Request{
		Op: Op(h.Op()), Flags: h.Flags(), Version: h.Version(), Count: h.Count(), Tenant: h.Tenant(),
		ID:     identity.ObjectID{Hi: h.IdHi(), Lo: h.IdLo()},
		Offset: h.Offset(), Length: h.Length(), PayloadLen: h.PayloadLen(),
	}
	if r.Version != ProtocolVersion {
		return r, fmt.Errorf("%w: %d", ErrVersion, r.Version)
	}
	return r, nil
}

// Response is the decoded form of a ResponseHeader.
type Response struct {
	Op         Op
	Status     Status
	Count      uint32
	ValueLen   uint64
	PayloadLen uint64
	Hot        Hot // GET replies of a primary only
}

// Encode writes the 32-byte prefix into b[:ResponseSize].
func (r *Response) Encode(b []byte) {
	_ = b[ResponseSize-1]
	var h fb.ResponseHeader
	h.Init(b, 0)
	h.MutateMagic(Magic)
	h.MutateOp(byte(r.Op))
	h.MutateStatus(byte(r.Status))
	h.MutateVersion(ProtocolVersion)
	h.MutateCount(r.Count)
	h.MutateReserved(r.Hot.Word())
	h.MutateValueLen(r.ValueLen)
	h.MutatePayloadLen(r.PayloadLen)
}

// DecodeResponse parses a response prefix.
func DecodeResponse(b []byte) (Response, error) {
	if len(b) < ResponseSize {
		return Response{}, ErrShort
	}
	var h fb.ResponseHeader
	h.Init(b, 0)
	if h.Magic() != Magic {
		return Response{}, ErrBadMagic
	}
	r := Response{Op: Op(h.Op()), Status: Status(h.Status()), Count: h.Count(), ValueLen: h.ValueLen(), PayloadLen: h.PayloadLen(),
		Hot: HotFromWord(h.Reserved())}
	if v := h.Version(); v != ProtocolVersion {
		return r, fmt.Errorf("%w: %d", ErrVersion, v)
	}
	if r.Status > MaxStatus {
		return r, fmt.Errorf("%w: status %d", ErrMalformed, r.Status)
	}
	return r, nil
}

// BatchItem is one item of a batch request.
type BatchItem struct {
	ID     identity.ObjectID
	Offset uint64
	Length uint64
	Flags  uint8
}

// Encode writes the 40-byte item into b[:BatchItemSize].
func (it *BatchItem) Encode(b []byte) {
	_ = b[BatchItemSize-1]
	var h fb.BatchItem
	h.Init(b, 0)
	h.MutateIdHi(it.ID.Hi)
	h.MutateIdLo(it.ID.Lo)
	h.MutateOffset(it.Offset)
	h.MutateLength(it.Length)
	h.MutateFlags(it.Flags)
	h.MutateReserved0(0)
	h.MutateReserved1(0)
	h.MutateReserved2(0)
}

// DecodeBatchItem parses an item.
func DecodeBatchItem(b []byte) (BatchItem, error) {
	if len(b) < BatchItemSize {
		return BatchItem{}, ErrShort
	}
	var h fb.BatchItem
	h.Init(b, 0)
	it := BatchItem{ID: identity.ObjectID{Hi: h.IdHi(), Lo: h.IdLo()}, Offset: h.Offset(), Length: h.Length(), Flags: h.Flags()}
	if it.Flags&^knownFlags != 0 {
		return it, fmt.Errorf("%w: item flags %#x", ErrMalformed, it.Flags)
	}
	return it, nil
}

// BatchResult is one item of a batch response.
type BatchResult struct {
	Status     Status
	Flags      uint8 // ResultLeased
	ValueLen   uint64
	PayloadLen uint64
	Hot        Hot // BatchGet hits of a primary only
}

// Encode writes the 24-byte result into b[:BatchResultSize].
func (r *BatchResult) Encode(b []byte) {
	_ = b[BatchResultSize-1]
	var h fb.BatchResult
	h.Init(b, 0)
	h.MutateStatus(byte(r.Status))
	h.MutateFlags(r.Flags)
	h.MutateReserved1(0)
	h.MutateReserved2(r.Hot.Word())
	h.MutateValueLen(r.ValueLen)
	h.MutatePayloadLen(r.PayloadLen)
}

// DecodeBatchResult parses a result.
func DecodeBatchResult(b []byte) (BatchResult, error) {
	if len(b) < BatchResultSize {
		return BatchResult{}, ErrShort
	}
	var h fb.BatchResult
	h.Init(b, 0)
	r := BatchResult{Status: Status(h.Status()), Flags: h.Flags(), ValueLen: h.ValueLen(), PayloadLen: h.PayloadLen(),
		Hot: HotFromWord(h.Reserved2())}
	if r.Status > MaxStatus {
		return r, fmt.Errorf("%w: status %d", ErrMalformed, r.Status)
	}
	if r.Flags&^ResultLeased != 0 {
		return r, fmt.Errorf("%w: result flags %#x", ErrMalformed, r.Flags)
	}
	return r, nil
}

// PutSgSegs writes segment lengths as the SG preamble.
func PutSgSegs(b []byte, segs []uint64) {
	for i, s := range segs {
		binary.LittleEndian.PutUint64(b[i*SgSegSize:], s)
	}
}

// DecodeSgSegs parses n segment lengths and returns their sum, rejecting zero-length
// segments and sums beyond maxValue.
func DecodeSgSegs(b []byte, n int, maxValue uint64) (segs []uint64, total uint64, err error) {
	if len(b) < n*SgSegSize {
		return nil, 0, ErrShort
	}
	segs = make([]uint64, n)
	for i := range segs {
		s := binary.LittleEndian.Uint64(b[i*SgSegSize:])
		if s == 0 || s > maxValue || total+s > maxValue {
			return nil, 0, fmt.Errorf("%w: sg segment %d length %d (total cap %d)", ErrLimit, i, s, maxValue)
		}
		segs[i] = s
		total += s
	}
	return segs, total, nil
}
