//go:build linux

package slab

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/store"
)

func sampleRecord() record {
	return record{State: stateLive, Class: 7, Key: store.Key{ID: identity.ObjectID{Hi: 0x0102030405060708, Lo: 0x1112131415161718}, Tenant: 99},
		Length: 123456, CRC: 0xdeadbeef, Seq: 1 << 40, Address: 77, Epoch: 3}
}

func TestRecordRoundTrip(t *testing.T) {
	tests := []record{
		sampleRecord(),
		{State: stateTombstone, Class: 0, Seq: 1, Address: 0, Epoch: 1},
		{State: stateLive, Class: 65535, Length: 1, Seq: ^uint64(0), Address: ^uint64(0), Epoch: ^uint32(0)},
	}
	for _, want := range tests {
		var b [recordSize]byte
		want.encode(b[:])
		got, err := decodeRecord(b[:])
		if err != nil {
			t.Fatalf("decode(%+v): %v", want, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round trip (-want +got):\n%s", diff)
		}
	}
}

func TestRecordRejects(t *testing.T) {
	var good [recordSize]byte
	r := sampleRecord()
	r.encode(good[:])
	tests := []struct {
		name string
		edit func(b []byte) []byte
		want error
	}{
		{"zero", func(b []byte) []byte { return make([]byte, recordSize) }, errRecordEmpty},
		{"short", func(b []byte) []byte { return b[:63] }, errRecordBad},
		{"nil", func(b []byte) []byte { return nil }, errRecordBad},
		{"bad magic", func(b []byte) []byte { b[0] ^= 1; return b }, errRecordBad},
		{"flipped payload crc", func(b []byte) []byte { b[37] ^= 1; return b }, errRecordBad},
		{"flipped record crc", func(b []byte) []byte { b[63] ^= 1; return b }, errRecordBad},
		{"junk after zero magic", func(b []byte) []byte { z := make([]byte, recordSize); z[10] = 1; return z }, errRecordBad},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.edit(bytes.Clone(good[:]))
			if _, err := decodeRecord(b); err != tc.want {
				t.Fatalf("decode = %v, want %v", err, tc.want)
			}
		})
	}
	// A well-formed record with an unknown state or a zero-length live value is bad too.
	for _, r := range []record{{State: 9, Seq: 1}, {State: stateLive, Length: 0, Seq: 1}} {
		var b [recordSize]byte
		r.encode(b[:])
		if _, err := decodeRecord(b[:]); err != errRecordBad {
			t.Fatalf("decode(%+v) = %v, want errRecordBad", r, err)
		}
	}
}

// FuzzDecodeRecord: decoding never panics, and whatever decodes re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	var b [recordSize]byte
	r := sampleRecord()
	r.encode(b[:])
	f.Add(b[:])
	f.Add(make([]byte, recordSize))
	f.Add([]byte("DFKR"))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := decodeRecord(in)
		if err != nil {
			return
		}
		var out [recordSize]byte
		got.encode(out[:])
		if !bytes.Equal(out[:], in[:recordSize]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in[:recordSize], out)
		}
	})
}
