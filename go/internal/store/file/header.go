//go:build linux

package file

import (
	"encoding/binary"
	"errors"
	"hash/crc32"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

// Header layout (48 bytes, little-endian):
//
//	0 u32 magic "DFKF"  4 u16 version  6 u16 reserved  8 u64 value length
//	16 u32 CRC32C of the value  20 u64 tenant  28 u64 id hi  36 u64 id lo
//	44 u32 CRC32C of bytes 0..43
const (
	headerSize    = 48
	headerMagic   = 0x464b4644 // "DFKF" read little-endian
	headerVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errBadHeader = errors.New("bad header")

type header struct {
	Length uint64
	CRC    uint32
	Key    store.Key
}

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.LittleEndian.PutUint32(b[0:], headerMagic)
	binary.LittleEndian.PutUint16(b[4:], headerVersion)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], h.Length)
	binary.LittleEndian.PutUint32(b[16:], h.CRC)
	binary.LittleEndian.PutUint64(b[20:], h.Key.Tenant)
	binary.LittleEndian.PutUint64(b[28:], h.Key.ID.Hi)
	binary.LittleEndian.PutUint64(b[36:], h.Key.ID.Lo)
	binary.LittleEndian.PutUint32(b[44:], crc32.Checksum(b[:44], castagnoli))
}

func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize || binary.LittleEndian.Uint32(b) != headerMagic ||
		binary.LittleEndian.Uint16(b[4:]) != headerVersion ||
		crc32.Checksum(b[:44], castagnoli) != binary.LittleEndian.Uint32(b[44:]) {
		return header{}, errBadHeader
	}
	return header{
		Length: binary.LittleEndian.Uint64(b[8:]),
		CRC:    binary.LittleEndian.Uint32(b[16:]),
		Key: store.Key{Tenant: binary.LittleEndian.Uint64(b[20:]),
			ID: identity.ObjectID{Hi: binary.LittleEndian.Uint64(b[28:]), Lo: binary.LittleEndian.Uint64(b[36:])}},
	}, nil
}
