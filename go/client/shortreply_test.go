package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// shortNode is a node that greets properly and then answers every GET and BATCH_GET with a
// hit of payload bytes, whatever the request asked for.
func shortNode(t *testing.T, payload []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	reply := func(nc net.Conn, op fb.Op, status fb.Status, count uint32, body ...[]byte) error {
		var h [wire.ResponseSize]byte
		n := 0
		for _, b := range body {
			n += len(b)
		}
		(&wire.Response{Op: op, Status: status, Count: count, PayloadLen: uint64(n)}).Encode(h[:])
		bufs := net.Buffers(append([][]byte{h[:]}, body...))
		_, err := bufs.WriteTo(nc)
		return err
	}
	serve := func(nc net.Conn) {
		defer nc.Close()
		for {
			var hb [wire.RequestSize]byte
			if _, err := io.ReadFull(nc, hb[:]); err != nil {
				return
			}
			req, err := wire.DecodeRequest(hb[:])
			if err != nil {
				return
			}
			body := make([]byte, req.PayloadLen)
			if _, err := io.ReadFull(nc, body); err != nil {
				return
			}
			switch req.Op {
			case fb.OpHello:
				err = reply(nc, fb.OpHello, fb.StatusOk, 0, wire.EncodeHello(wire.Hello{ProtocolVersion: 1, MinProtocolVersion: 1,
					MaxValueBytes: 1 << 26, MaxBatchItems: 1024, MaxDepth: 1, SoftwareVersion: "short", Transport: "tcp"}))
			case fb.OpGet:
				err = reply(nc, fb.OpGet, fb.StatusOk, 0, payload)
			case fb.OpBatchGet:
				// The response header's payload_len covers results and values; Count items.
				var out [][]byte
				for range req.Count {
					var rb [wire.BatchResultSize]byte
					(&wire.BatchResult{Status: fb.StatusOk, ValueLen: uint64(len(payload)), PayloadLen: uint64(len(payload))}).Encode(rb[:])
					out = append(out, rb[:], payload)
				}
				err = reply(nc, fb.OpBatchGet, fb.StatusOk, req.Count, out...)
			default:
				return
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); serve(nc) }()
		}
	}()
	return ln.Addr().String()
}

// A hit shorter than an exact read, or an empty hit, is a protocol error, never success
// with a buffer the reply did not fill; both I/O modes, scalar and batch.
func TestShortHitIsAProtocolError(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			payload []byte
			auto    bool
		}{
			{"short exact", []byte("123456789"), false},
			{"empty exact", nil, false},
			{"empty auto", nil, true},
		} {
			addr := shortNode(t, tc.payload)
			c := newClient(t, addr, client.Options{BlockingIO: blocking})
			buf := make([]byte, 10)
			var err error
			if tc.auto {
				_, err = c.GetAuto(context.Background(), []byte("k"), buf)
			} else {
				err = c.Get(context.Background(), []byte("k"), buf)
			}
			if !errors.Is(err, client.ErrProtocol) {
				t.Errorf("blocking=%v %s: Get = %v, want ErrProtocol", blocking, tc.name, err)
			}
			mode := client.Exact
			if tc.auto {
				mode = client.Auto
			}
			items := []client.Item{{Key: []byte("k"), Buf: make([]byte, 10)}}
			berr := c.BatchGet(context.Background(), items, mode)
			if berr == nil && items[0].Err == nil {
				t.Errorf("blocking=%v %s: batch item reported a %d-byte hit", blocking, tc.name, items[0].N)
			}
		}
	}
}
