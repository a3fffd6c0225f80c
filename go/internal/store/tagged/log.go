package tagged

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Log record (little-endian): u32 body length, u32 CRC32C of the body, body. Body: u8
// kind, u64 tenant, u64 id hi, u64 id lo; a set record then has u64 value length and the
// tag as an ObjectTag FlatBuffer (wire.EncodeTag).
const (
	recSet     = 1
	recDel     = 2
	recHead    = 8
	recKeyLen  = 1 + 24
	maxRecBody = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errTorn = errors.New("tagged: torn or corrupt log record")

type logRec struct {
	kind uint8
	key  store.Key
	size int64
	tag  wire.ObjectTag
}

func appendRec(b []byte, r *logRec) []byte {
	var body []byte
	body = append(body, r.kind)
	body = binary.LittleEndian.AppendUint64(body, r.key.Tenant)
	body = binary.LittleEndian.AppendUint64(body, r.key.ID.Hi)
	body = binary.LittleEndian.AppendUint64(body, r.key.ID.Lo)
	if r.kind == recSet {
		body = binary.LittleEndian.AppendUint64(body, uint64(r.size))
		body = append(body, wire.EncodeTag(&r.tag)...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
	return append(b, body...)
}

// decodeRec parses the record at the start of b and returns its length. A short, torn or
// corrupt record is errTorn (the log is cut there); it never panics.
func decodeRec(b []byte) (logRec, int, error) {
	if len(b) < recHead {
		return logRec{}, 0, errTorn
	}
	n := binary.LittleEndian.Uint32(b)
	if n < recKeyLen || n > maxRecBody || uint64(len(b)-recHead) < uint64(n) {
		return logRec{}, 0, errTorn
	}
	body := b[recHead : recHead+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return logRec{}, 0, errTorn
	}
	r := logRec{kind: body[0], key: store.Key{
		Tenant: binary.LittleEndian.Uint64(body[1:]),
		ID:     identity.ObjectID{Hi: binary.LittleEndian.Uint64(body[9:]), Lo: binary.LittleEndian.Uint64(body[17:])},
	}}
	switch r.kind {
	case recDel:
		if n != recKeyLen {
			return logRec{}, 0, fmt.Errorf("%w: delete record of %d bytes", errTorn, n)
		}
	case recSet:
		if n < recKeyLen+8 {
			return logRec{}, 0, fmt.Errorf("%w: set record of %d bytes", errTorn, n)
		}
		r.size = int64(binary.LittleEndian.Uint64(body[recKeyLen:]))
		tag, err := wire.DecodeTag(body[recKeyLen+8:])
		if err != nil {
			return logRec{}, 0, fmt.Errorf("%w: %w", errTorn, err)
		}
		if r.size <= 0 || tag.ID != r.key.ID {
			return logRec{}, 0, fmt.Errorf("%w: set record disagrees with itself", errTorn)
		}
		r.tag = tag
	default:
		return logRec{}, 0, fmt.Errorf("%w: kind %d", errTorn, r.kind)
	}
	return r, recHead + int(n), nil
}
