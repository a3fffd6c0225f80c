package wire

import (
	"fmt"
	"sort"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Hello is the version/limits handshake carried by OpHello in both directions.
type Hello struct {
	ProtocolVersion    uint32
	MinProtocolVersion uint32
	MaxValueBytes      uint64
	MaxBatchItems      uint32
	MaxDepth           uint32
	SoftwareVersion    string
	Transport          string
	// Token is the client's tenant token (servers with --auth-tokens check it). Sent only
	// client -> server, never echoed; do not log it.
	Token string
}

// EncodeHello builds the Hello table.
func EncodeHello(h Hello) []byte {
	b := flatbuffers.NewBuilder(128)
	sv := b.CreateString(h.SoftwareVersion)
	tr := b.CreateString(h.Transport)
	var tok flatbuffers.UOffsetT
	if h.Token != "" {
		tok = b.CreateString(h.Token)
	}
	fb.HelloStart(b)
	fb.HelloAddProtocolVersion(b, h.ProtocolVersion)
	fb.HelloAddMinProtocolVersion(b, h.MinProtocolVersion)
	fb.HelloAddMaxValueBytes(b, h.MaxValueBytes)
	fb.HelloAddMaxBatchItems(b, h.MaxBatchItems)
	fb.HelloAddMaxDepth(b, h.MaxDepth)
	fb.HelloAddSoftwareVersion(b, sv)
	fb.HelloAddTransport(b, tr)
	if tok != 0 {
		fb.HelloAddToken(b, tok)
	}
	b.Finish(fb.HelloEnd(b))
	return b.FinishedBytes()
}

// DecodeHello parses a Hello table; malformed input is an error, never a panic.
func DecodeHello(buf []byte) (h Hello, err error) {
	err = safeTable(buf, func(buf []byte) {
		t := fb.GetRootAsHello(buf, 0)
		h = Hello{
			ProtocolVersion: t.ProtocolVersion(), MinProtocolVersion: t.MinProtocolVersion(),
			MaxValueBytes: t.MaxValueBytes(), MaxBatchItems: t.MaxBatchItems(), MaxDepth: t.MaxDepth(),
			SoftwareVersion: string(t.SoftwareVersion()), Transport: string(t.Transport()),
			Token: string(t.Token()),
		}
	})
	if err != nil {
		return Hello{}, fmt.Errorf("wire: hello: %w", err)
	}
	if len(h.Token) > MaxTokenLen {
		return Hello{}, fmt.Errorf("wire: hello: %w: %d-byte token > %d", ErrLimit, len(h.Token), MaxTokenLen)
	}
	if h.MinProtocolVersion > h.ProtocolVersion {
		return Hello{}, fmt.Errorf("wire: hello: %w: min version %d > version %d", ErrMalformed, h.MinProtocolVersion, h.ProtocolVersion)
	}
	return h, nil
}

// Negotiate returns the protocol version both sides speak, or ErrVersion (fail closed).
func Negotiate(local, remote Hello) (uint32, error) {
	v := min(local.ProtocolVersion, remote.ProtocolVersion)
	if v < local.MinProtocolVersion || v < remote.MinProtocolVersion {
		return 0, fmt.Errorf("%w: local %d..%d, remote %d..%d", ErrVersion,
			local.MinProtocolVersion, local.ProtocolVersion, remote.MinProtocolVersion, remote.ProtocolVersion)
	}
	return v, nil
}

// EncodeStats builds a StatsReply table; entries are sorted by name (the schema's key).
func EncodeStats(stats map[string]float64) []byte {
	names := make([]string, 0, len(stats))
	for k := range stats {
		names = append(names, k)
	}
	sort.Strings(names)
	b := flatbuffers.NewBuilder(64 * (len(names) + 1))
	offs := make([]flatbuffers.UOffsetT, len(names))
	for i, n := range names {
		s := b.CreateString(n)
		fb.StatEntryStart(b)
		fb.StatEntryAddName(b, s)
		fb.StatEntryAddValue(b, stats[n])
		offs[i] = fb.StatEntryEnd(b)
	}
	fb.StatsReplyStartEntriesVector(b, len(offs))
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	vec := b.EndVector(len(offs))
	fb.StatsReplyStart(b)
	fb.StatsReplyAddEntries(b, vec)
	b.Finish(fb.StatsReplyEnd(b))
	return b.FinishedBytes()
}

// DecodeStats parses a StatsReply table.
func DecodeStats(buf []byte) (map[string]float64, error) {
	out := map[string]float64{}
	err := safeTable(buf, func(buf []byte) {
		t := fb.GetRootAsStatsReply(buf, 0)
		n := t.EntriesLength()
		if n > len(buf)/4 {
			panic("entry count exceeds buffer")
		}
		var e fb.StatEntry
		for i := 0; i < n; i++ {
			if t.Entries(&e, i) {
				out[string(e.Name())] = e.Value()
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("wire: stats: %w", err)
	}
	return out, nil
}

// safeTable is DecodeTable for a decode that reports nothing but panics.
func safeTable(buf []byte, decode func(buf []byte)) error {
	return DecodeTable(buf, func(b []byte) error { decode(b); return nil })
}

// DecodeTable runs a generated-accessor decode over untrusted bytes: the one guard every
// FlatBuffers decoder of the project goes through. The generated Go code has no verifier
// and indexes slices directly, so a hostile offset panics; the panic is contained here and
// turned into ErrMalformed, as are a buffer too short for a root and a root offset past
// its end. decode gets buf clipped to its length (ClipTable) and must read the table
// through that slice only; its own error is returned as it is.
func DecodeTable(buf []byte, decode func(buf []byte) error) (err error) {
	if len(buf) < 8 {
		return fmt.Errorf("%w: %d-byte table", ErrMalformed, len(buf))
	}
	if root := flatbuffers.GetUOffsetT(buf); uint64(root)+4 > uint64(len(buf)) {
		return fmt.Errorf("%w: root offset %d beyond %d bytes", ErrMalformed, root, len(buf))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	return decode(ClipTable(buf))
}

// ClipTable returns buf with its capacity cut to its length. FlatBuffers' Go accessors
// slice vectors and strings as Bytes[start:start+n], which Go allows up to the capacity,
// not the length: over a frame that is a window of a larger buffer (a reader's, the fuzz
// engine's), a hostile length would read the bytes after the frame instead of panicking.
// Every decoder of untrusted tables reads through a clipped slice.
func ClipTable(buf []byte) []byte { return buf[:len(buf):len(buf)] }
