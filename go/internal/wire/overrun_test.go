package wire

import (
	"errors"
	"testing"

	"github.com/dfkv/dfkv/go/internal/testutil"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// TestDecodersStayInsideTheFrame: a string whose length runs past the end of the frame is
// malformed, also when the frame is a window of a larger buffer (a reader's, the fuzz
// engine's) whose bytes after the frame the generated accessors could otherwise reach.
func TestDecodersStayInsideTheFrame(t *testing.T) {
	member := &Member{ID: "member-id-1", Addr: "127.0.0.1:1", Weight: 1, Eligible: true}
	cases := []struct {
		name   string
		frame  []byte
		str    string
		decode func([]byte) error
	}{
		{"hello token", EncodeHello(Hello{ProtocolVersion: 1, MinProtocolVersion: 1, Transport: "tcp", Token: "tenant-token"}), "tenant-token",
			func(b []byte) error { _, err := DecodeHello(b); return err }},
		{"stats name", EncodeStats(map[string]float64{"dfkv_stat_name": 1}), "dfkv_stat_name",
			func(b []byte) error { _, err := DecodeStats(b); return err }},
		{"mds request group", EncodeMdsRequest(&MdsRequest{Op: fb.MdsOpRegisterMember, Group: "group-name", Member: member}), "group-name",
			func(b []byte) error { _, err := DecodeMdsRequest(b); return err }},
		{"mds response error", EncodeMdsResponse(&MdsResponse{Error: "error-text"}), "error-text",
			func(b []byte) error { _, err := DecodeMdsResponse(b); return err }},
		{"member id", EncodeMember(member), "member-id-1",
			func(b []byte) error { _, err := DecodeMember(b); return err }},
		{"client hostname", EncodeClientInfo(&ClientInfo{ID: "c", Hostname: "host-name"}), "host-name",
			func(b []byte) error { _, err := DecodeClientInfo(b); return err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.decode(c.frame); err != nil {
				t.Fatalf("intact frame: %v", err)
			}
			bad, err := testutil.OverrunString(c.frame, c.str)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.decode(bad); !errors.Is(err, ErrMalformed) {
				t.Fatalf("string running past the frame: err %v, want ErrMalformed", err)
			}
		})
	}
}
