//go:build linux

package client_test

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/store/slab"
)

// BenchmarkGet4KiB and BenchmarkRawRoundTrip4KiB measure, side by side, one dfkv GET of a
// 4 KiB value through the client and server (mem engine) and a raw request/reply of the
// same size on loopback: their ratio is the per-request overhead of the whole stack.
func BenchmarkGet4KiB(b *testing.B) { benchGet4KiB(b, context.Background(), false) }

// BenchmarkGet4KiBCancelCtx is BenchmarkGet4KiB with a cancellable context (a callback
// registered and removed per request); BlockingIO variants measure the C ABI's path.
func BenchmarkGet4KiBCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchGet4KiB(b, ctx, false)
}

func BenchmarkGet4KiBBlockingIO(b *testing.B) { benchGet4KiB(b, context.Background(), true) }

func BenchmarkGet4KiBBlockingIOCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchGet4KiB(b, ctx, true)
}

func benchGet4KiB(b *testing.B, ctx context.Context, blocking bool) {
	n := startOnB(b)
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: n, Weight: 1}})
	c, _ := client.New(client.Options{Membership: ms, BlockingIO: blocking})
	defer c.Close()
	val := make([]byte, 4096)
	if err := c.Put(context.Background(), []byte("k"), val); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Get(ctx, []byte("k"), buf); err != nil {
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

// BenchmarkLookup64 compares, side by side on one slab-engine server, a 64-key BatchExist
// with a 64-key BatchExistLease (every key a hit, so every key is leased or re-leased):
// their ratio is what a leased lookup costs over a plain one.
func BenchmarkLookup64(b *testing.B) {
	eng, err := slab.Open(slab.Config{Dir: b.TempDir(), CapacityBytes: 64 << 20, ExtentBytes: 8 << 20,
		MaxValueBytes: 1 << 20, BufferPoolBytes: 8 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close() })
	srv, err := server.New(server.Config{Engine: eng})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(tcpListener{ln.(*net.TCPListener)})
	b.Cleanup(func() { ln.Close() })
	ms, _ := client.NewStatic([]client.Member{{ID: "n", Addr: ln.Addr().String(), Weight: 1}})
	c, _ := client.New(client.Options{Membership: ms})
	b.Cleanup(func() { c.Close() })
	items := make([]client.Item, 64)
	for i := range items {
		items[i].Key = []byte{byte(i), 'k'}
		if err := c.Put(context.Background(), items[i].Key, make([]byte, 4096)); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name string
		call func() error
	}{
		{"exist", func() error { return c.BatchExist(context.Background(), items) }},
		{"exist_lease", func() error { return c.BatchExistLease(context.Background(), items, 10*time.Second) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := bc.call(); err != nil || items[63].Err != nil {
					b.Fatal(err, items[63].Err)
				}
			}
		})
	}
}
