package client_test

import (
	"context"
	"crypto/tls"
	"io"
	"syscall"
	"testing"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/secure"
	"github.com/dfkv/dfkv/go/internal/secure/securetest"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

// BenchmarkGet1MiB{Plain,TLS} and BenchmarkGet4KiB{Plain,TLS}: the same warm GET (mem
// engine) over plaintext and over TLS 1.3; compare the pairs side by side
// (go test -bench 'Get(1MiB|4KiB)(Plain|TLS)' ./go/client/).
func BenchmarkGet1MiBPlain(b *testing.B) { benchGet(b, 1<<20, false) }
func BenchmarkGet1MiBTLS(b *testing.B)   { benchGet(b, 1<<20, true) }
func BenchmarkGet4KiBPlain(b *testing.B) { benchGet(b, 4<<10, false) }
func BenchmarkGet4KiBTLS(b *testing.B)   { benchGet(b, 4<<10, true) }

func benchGet(b *testing.B, size int, useTLS bool) {
	srv, err := server.New(server.Config{Engine: store.NewMem(64 << 20)})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	opts := client.Options{}
	if useTLS {
		dir := b.TempDir()
		ca, err := securetest.NewCA("ca")
		if err != nil {
			b.Fatal(err)
		}
		caFile, _ := ca.WriteCA(dir, "ca")
		leaf, _ := ca.Issue("s", securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
		cert, key, _ := leaf.Write(dir, "s")
		st, err := secure.LoadServer(secure.TLSFiles{Cert: cert, Key: key}, nil)
		if err != nil {
			b.Fatal(err)
		}
		go srv.Serve(secure.Listener(ln, st.Config()))
		if opts.TLS, err = client.TLSFromFiles(caFile, "", ""); err != nil {
			b.Fatal(err)
		}
	} else {
		go srv.Serve(ln)
	}
	opts.Membership, _ = client.NewStatic([]client.Member{{ID: "n", Addr: ln.Addr().String(), Weight: 1}})
	c, err := client.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(context.Background(), []byte("k"), make([]byte, size)); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		if err := c.Get(context.Background(), []byte("k"), buf); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time (client + server, user + system) per GET: on a shared machine wall time
	// tracks the neighbours' load, CPU time tracks the work.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkRawTLSRoundTrip1MiB is the crypto/tls reference for BenchmarkGet1MiBTLS: a
// 64-byte request answered by 1 MiB over TLS 1.3 on loopback with nothing else around it.
func BenchmarkRawTLSRoundTrip1MiB(b *testing.B) {
	dir := b.TempDir()
	ca, err := securetest.NewCA("ca")
	if err != nil {
		b.Fatal(err)
	}
	caFile, _ := ca.WriteCA(dir, "ca")
	leaf, _ := ca.Issue("s", securetest.LeafOptions{Hosts: []string{"127.0.0.1"}})
	certFile, keyFile, _ := leaf.Write(dir, "s")
	st, err := secure.LoadServer(secure.TLSFiles{Cert: certFile, Key: keyFile}, nil)
	if err != nil {
		b.Fatal(err)
	}
	inner, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln := secure.Listener(inner, st.Config())
	defer ln.Close()
	val := make([]byte, 1<<20)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req [64]byte
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			if _, err := c.Write(val); err != nil {
				return
			}
		}
	}()
	cfg, err := client.TLSFromFiles(caFile, "", "")
	if err != nil {
		b.Fatal(err)
	}
	nc, err := secure.Dialer{Inner: tcp.Dialer{}, Config: func() *tls.Config { return cfg }}.DialContext(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var req [64]byte
	buf := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		if _, err := nc.Write(req[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
