package mds

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

func startTestServer(t *testing.T, svc *Service, cfg ServerConfig) string {
	t.Helper()
	cfg.Service, cfg.Logger = svc, quiet()
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func TestServerFailover(t *testing.T) {
	svc, _, _ := newTestService(t)
	live := startTestServer(t, svc, ServerConfig{})
	c, err := mdsclient.New([]string{deadAddr(t), live}, mdsclient.Options{CallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, ep, err := c.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: member("n1", "127.0.0.1:5")}); err != nil || ep != live {
		t.Fatalf("register through failover: ep=%s err=%v", ep, err)
	}
	for i := 0; i < 3; i++ { // the cached connection is reused
		resp, _, err := c.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: "g"})
		if err != nil || len(resp.Topology.Members) != 1 {
			t.Fatalf("list: %v %+v", err, resp)
		}
	}
	if _, _, err := c.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpHeartbeatMember, Group: "g", Member: member("nx", "127.0.0.1:6")}); !errors.Is(err, mdsclient.ErrNotRegistered) {
		t.Fatalf("heartbeat of unknown member: %v", err)
	}
	if _, _, err := c.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpRegisterMember, Group: "g", Member: &wire.Member{ID: "bad"}}); !errors.Is(err, mdsclient.ErrRejected) {
		t.Fatalf("invalid member: %v", err)
	}
	all, _ := mdsclient.New([]string{deadAddr(t), deadAddr(t)}, mdsclient.Options{CallTimeout: 300 * time.Millisecond})
	if _, _, err := all.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology}); !errors.Is(err, mdsclient.ErrUnavailable) {
		t.Fatalf("no replica: %v", err)
	}
}

func TestServerBadFrames(t *testing.T) {
	svc, _, _ := newTestService(t)
	addr := startTestServer(t, svc, ServerConfig{FirstRequestTimeout: 300 * time.Millisecond, MaxConns: 4})
	frame := func(r wire.Request, payload []byte) []byte {
		b := make([]byte, wire.RequestSize+len(payload))
		r.Encode(b)
		copy(b[wire.RequestSize:], payload)
		return b
	}
	readReply := func(t *testing.T, nc net.Conn) (wire.Response, error) {
		_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
		var h [wire.ResponseSize]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			return wire.Response{}, err
		}
		r, err := wire.DecodeResponse(h[:])
		if err == nil && r.PayloadLen > 0 {
			_, err = io.CopyN(io.Discard, nc, int64(r.PayloadLen))
		}
		return r, err
	}
	tests := []struct {
		name      string
		send      []byte
		status    fb.Status
		stillOpen bool
	}{
		{"bad magic", make([]byte, wire.RequestSize), fb.StatusInvalid, false},
		{"data-plane op", frame(wire.Request{Op: fb.OpGet}, nil), fb.StatusInvalid, true},
		{"oversized", frame(wire.Request{Op: fb.OpMds, PayloadLen: 1 << 30}, nil), fb.StatusInvalid, false},
		{"garbage table", frame(wire.Request{Op: fb.OpMds, PayloadLen: 8}, []byte{0xff, 0xff, 0, 0, 1, 2, 3, 4}), fb.StatusOk, true},
	}
	listReq := wire.EncodeMdsRequest(&wire.MdsRequest{Op: fb.MdsOpListTopology})
	good := frame(wire.Request{Op: fb.OpMds, PayloadLen: uint64(len(listReq))}, listReq)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.Write(tt.send)
			r, err := readReply(t, nc)
			if err != nil || r.Status != tt.status {
				t.Fatalf("reply %+v err %v", r, err)
			}
			nc.Write(good)
			r, err = readReply(t, nc)
			if tt.stillOpen != (err == nil && r.Status == fb.StatusOk) {
				t.Fatalf("after the bad frame: %+v %v (want open=%v)", r, err, tt.stillOpen)
			}
		})
	}
	t.Run("first request deadline", func(t *testing.T) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("silent connection not closed by the server: %v", err)
		}
	})
}
