package wire

import (
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func TestHotWordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in, want Hot
	}{
		{Hot{}, Hot{}},
		{Hot{Replicas: 0, ValidMS: 500}, Hot{}}, // no replicas: not hot
		{Hot{Replicas: 3, ValidMS: 2250}, Hot{Replicas: 3, ValidMS: 2250}},
		{Hot{Replicas: 5, ValidMS: 2250, SkipPrimary: true}, Hot{Replicas: 5, ValidMS: 2250, SkipPrimary: true}},
		{Hot{Replicas: 0, ValidMS: 500, SkipPrimary: true}, Hot{}},
		{Hot{Replicas: MaxHotReplicas, ValidMS: MaxHotValidMS, SkipPrimary: true}, Hot{Replicas: MaxHotReplicas, ValidMS: MaxHotValidMS, SkipPrimary: true}},
		{Hot{Replicas: 200, ValidMS: 1 << 30}, Hot{Replicas: MaxHotReplicas, ValidMS: MaxHotValidMS}}, // clamped
	} {
		r := Response{Op: fb.OpGet, Status: fb.StatusOk, ValueLen: 9, PayloadLen: 9, Hot: tc.in}
		var b [ResponseSize]byte
		r.Encode(b[:])
		got, err := DecodeResponse(b[:])
		if err != nil || got.Hot != tc.want || got.ValueLen != 9 {
			t.Errorf("response %+v: decoded %+v, %v; want hot %+v", tc.in, got, err, tc.want)
		}
		br := BatchResult{Status: fb.StatusOk, ValueLen: 9, PayloadLen: 9, Hot: tc.in}
		var bb [BatchResultSize]byte
		br.Encode(bb[:])
		gotB, err := DecodeBatchResult(bb[:])
		if err != nil || gotB.Hot != tc.want || gotB.PayloadLen != 9 {
			t.Errorf("batch result %+v: decoded %+v, %v; want hot %+v", tc.in, gotB, err, tc.want)
		}
	}
}

// FlagReplica is accepted on Get, Put and Remove only.
func TestReplicaFlagOps(t *testing.T) {
	l := DefaultLimits()
	for _, tc := range []struct {
		op      Op
		payload uint64
		ok      bool
	}{
		{fb.OpGet, 0, true},
		{fb.OpPut, 10, true},
		{fb.OpRemove, 0, true},
		{fb.OpExist, 0, false},
		{fb.OpPing, 0, false},
		{fb.OpSgGet, 8, false},
	} {
		r := Request{Op: tc.op, Flags: FlagReplica, PayloadLen: tc.payload, Count: 1}
		err := l.Check(&r)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMalformed)) {
			t.Errorf("op %d with the replica flag: %v, want ok=%v", tc.op, err, tc.ok)
		}
	}
}
