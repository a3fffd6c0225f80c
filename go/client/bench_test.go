package client_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
)

// BenchmarkGet4KiB and BenchmarkRawRoundTrip4KiB measure, side by side, one dfkv GET of a
// 4 KiB value through the client and server (mem engine) and a raw request/reply of the
// same size on loopback: their ratio is the per-request overhead of the whole stack.
func BenchmarkGet4KiB(b *testing.B) {
	n := startOnB(b)
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: n, Weight: 1}})
	c, _ := client.New(client.Options{Membership: ms})
	defer c.Close()
	val := make([]byte, 4096)
	if err := c.Put([]byte("k"), val); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Get([]byte("k"), buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawRoundTrip4KiB(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				c.(*net.TCPConn).SetNoDelay(true)
				var req [64]byte
				val := make([]byte, 32+4096)
				for {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					binary.LittleEndian.PutUint64(val, 4096)
					if _, err := c.Write(val); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	var req [64]byte
	resp := make([]byte, 32+4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(req[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			b.Fatal(err)
		}
	}
}

func startOnB(b *testing.B) string {
	srv, err := server.New(server.Config{Engine: store.NewMem(64 << 20)})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(tcpListener{ln.(*net.TCPListener)})
	b.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

type tcpListener struct{ *net.TCPListener }

func (l tcpListener) Accept() (net.Conn, error) { return l.TCPListener.Accept() }
