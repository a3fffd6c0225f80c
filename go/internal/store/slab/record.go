//go:build linux

package slab

import (
	"encoding/binary"
	"errors"
	"hash/crc32"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

// Record layout (64 bytes, little-endian):
//
//	0  u32 magic "DFKR"     4  u8 version   5  u8 state   6  u16 class
//	8  u64 object id hi     16 u64 object id lo           24 u64 tenant
//	32 u32 value length     36 u32 payload CRC32C
//	40 u64 sequence number  48 u64 address (record index in slots.tbl)
//	56 u32 epoch            60 u32 CRC32C of bytes 0..59
const (
	recordSize    = 64
	recordMagic   = 0x524b4644 // "DFKR" read little-endian
	recordVersion = 1
)

// Record states.
const (
	stateLive      = 1
	stateTombstone = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is the decoded form of one slots.tbl entry.
type record struct {
	State   uint8
	Class   uint16
	Key     store.Key
	Length  uint32
	CRC     uint32
	Seq     uint64
	Address uint64
	Epoch   uint32
}

var (
	errRecordEmpty = errors.New("empty record")
	errRecordBad   = errors.New("bad record")
)

func (r *record) encode(b []byte) {
	_ = b[recordSize-1]
	binary.LittleEndian.PutUint32(b[0:], recordMagic)
	b[4] = recordVersion
	b[5] = r.State
	binary.LittleEndian.PutUint16(b[6:], r.Class)
	binary.LittleEndian.PutUint64(b[8:], r.Key.ID.Hi)
	binary.LittleEndian.PutUint64(b[16:], r.Key.ID.Lo)
	binary.LittleEndian.PutUint64(b[24:], r.Key.Tenant)
	binary.LittleEndian.PutUint32(b[32:], r.Length)
	binary.LittleEndian.PutUint32(b[36:], r.CRC)
	binary.LittleEndian.PutUint64(b[40:], r.Seq)
	binary.LittleEndian.PutUint64(b[48:], r.Address)
	binary.LittleEndian.PutUint32(b[56:], r.Epoch)
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

// decodeRecord parses one record. An all-zero record (a hole in the sparse table) is
// errRecordEmpty; anything else that does not verify is errRecordBad. It never panics.
func decodeRecord(b []byte) (record, error) {
	if len(b) < recordSize {
		return record{}, errRecordBad
	}
	b = b[:recordSize]
	if binary.LittleEndian.Uint32(b[0:]) != recordMagic {
		if allZero(b) {
			return record{}, errRecordEmpty
		}
		return record{}, errRecordBad
	}
	if crc32.Checksum(b[:60], castagnoli) != binary.LittleEndian.Uint32(b[60:]) {
		return record{}, errRecordBad
	}
	r := record{
		State:   b[5],
		Class:   binary.LittleEndian.Uint16(b[6:]),
		Key:     store.Key{ID: identity.ObjectID{Hi: binary.LittleEndian.Uint64(b[8:]), Lo: binary.LittleEndian.Uint64(b[16:])}, Tenant: binary.LittleEndian.Uint64(b[24:])},
		Length:  binary.LittleEndian.Uint32(b[32:]),
		CRC:     binary.LittleEndian.Uint32(b[36:]),
		Seq:     binary.LittleEndian.Uint64(b[40:]),
		Address: binary.LittleEndian.Uint64(b[48:]),
		Epoch:   binary.LittleEndian.Uint32(b[56:]),
	}
	if b[4] != recordVersion || (r.State != stateLive && r.State != stateTombstone) {
		return record{}, errRecordBad
	}
	if r.State == stateLive && r.Length == 0 {
		return record{}, errRecordBad
	}
	return r, nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
