package wire

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func sampleMember() *Member {
	return &Member{ID: "n1", Addr: "10.0.0.1:12000", Weight: 3, Eligible: true, Version: "1.2.3",
		Config: []KV{{"capacity", "1073741824"}, {"engine", "slab"}},
		Rails:  []Rail{{Device: "mlx5_0", PortState: 4, PhysState: 5, QueryOK: true}}}
}

func TestMdsRoundTrip(t *testing.T) {
	cl := &ClientInfo{ID: "c1", Info: []KV{{"engine", "vllm"}}, PID: 42, Hostname: "h", RegisteredUnixMS: 7}
	reqs := []MdsRequest{
		{Op: fb.MdsOpRegisterMember, Group: "g", Member: sampleMember()},
		{Op: fb.MdsOpHeartbeatMember, Group: "g", Member: &Member{ID: "n2", Addr: "h:1", Weight: 1, Eligible: false}},
		{Op: fb.MdsOpListTopology, Group: "g", KnownMembersEpoch: 99},
		{Op: fb.MdsOpListTopology, Group: "g", KnownMembersEpoch: 7, WaitMS: 10000, KnownTopologyEpoch: 1 << 63},
		{Op: fb.MdsOpRegisterClient, Group: "g", Client: cl},
	}
	for _, r := range reqs {
		got, err := DecodeMdsRequest(EncodeMdsRequest(&r))
		if err != nil {
			t.Fatalf("%v: %v", r.Op, err)
		}
		if d := cmp.Diff(r, got); d != "" {
			t.Fatalf("request mismatch (-want +got):\n%s", d)
		}
	}
	resps := []MdsResponse{
		{Status: fb.StatusOk, LeaseTTLMS: 3000},
		{Status: fb.StatusNotFound, Error: "not registered"},
		{Status: fb.StatusOk, Topology: &Topology{MembersEpoch: 1, TopologyEpoch: 2, Members: []Member{*sampleMember()}}},
		{Status: fb.StatusOk, Topology: &Topology{MembersEpoch: 5}},
		{Status: fb.StatusOk, WaitMS: 10000},
		{Status: fb.StatusOk, Clients: []ClientInfo{*cl}},
	}
	for _, r := range resps {
		got, err := DecodeMdsResponse(EncodeMdsResponse(&r))
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(r, got); d != "" {
			t.Fatalf("response mismatch (-want +got):\n%s", d)
		}
	}
	m, err := DecodeMember(EncodeMember(sampleMember()))
	if err != nil || !cmp.Equal(m, *sampleMember()) {
		t.Fatalf("member round trip: %v %+v", err, m)
	}
	c, err := DecodeClientInfo(EncodeClientInfo(cl))
	if err != nil || !cmp.Equal(c, *cl) {
		t.Fatalf("client round trip: %v %+v", err, c)
	}
}

func TestMdsDecodeRejects(t *testing.T) {
	long := make([]byte, MaxMdsIDLen+1)
	for i := range long {
		long[i] = 'x'
	}
	tooMany := make([]KV, MaxMdsKVs+1)
	tests := []struct {
		name string
		buf  []byte
		want error
	}{
		{"short", []byte{1, 2}, ErrMalformed},
		{"root past end", []byte{200, 0, 0, 0, 0, 0, 0, 0}, ErrMalformed},
		{"invalid op", EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpInvalid}), ErrUnknownOp},
		{"unknown op", EncodeMdsRequest(&MdsRequest{Op: 200}), ErrUnknownOp},
		{"long group", EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpListTopology, Group: string(long)}), ErrLimit},
		{"too many kvs", EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpRegisterMember, Member: &Member{ID: "a", Config: tooMany}}), ErrLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeMdsRequest(tt.buf); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := DecodeMdsResponse(EncodeMdsResponse(&MdsResponse{Status: 200})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad status accepted: %v", err)
	}
}

func TestCheckMds(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		name string
		r    Request
		ok   bool
	}{
		{"ok", Request{Op: fb.OpMds, PayloadLen: 100}, true},
		{"data op", Request{Op: fb.OpGet}, false},
		{"empty", Request{Op: fb.OpMds}, false},
		{"too big", Request{Op: fb.OpMds, PayloadLen: l.MaxControl + 1}, false},
		{"flags", Request{Op: fb.OpMds, PayloadLen: 10, Flags: 1}, false},
	}
	for _, tt := range tests {
		if err := l.CheckMds(&tt.r); (err == nil) != tt.ok {
			t.Errorf("%s: err = %v", tt.name, err)
		}
	}
}

func TestMdsRequestToken(t *testing.T) {
	in := MdsRequest{Op: fb.MdsOpListTopology, Group: "g", Token: "admin-token"}
	got, err := DecodeMdsRequest(EncodeMdsRequest(&in))
	if err != nil || got.Token != in.Token || got.Group != "g" {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	in.Token = string(make([]byte, MaxTokenLen+1))
	if _, err := DecodeMdsRequest(EncodeMdsRequest(&in)); !errors.Is(err, ErrLimit) {
		t.Fatalf("oversized token: %v", err)
	}
}
