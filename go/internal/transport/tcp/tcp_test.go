package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestListenDialRoundTrip(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		acc <- result{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d Dialer
	if d.Mode() != "tcp" {
		t.Fatalf("Mode = %q", d.Mode())
	}
	c, err := d.DialContext(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.c.Close()
	// Both ends are tuned TCP connections.
	for _, conn := range []net.Conn{c, r.c} {
		if _, ok := conn.(*net.TCPConn); !ok {
			t.Fatalf("%T is not a *net.TCPConn", conn)
		}
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestErrors(t *testing.T) {
	if _, err := Listen("127.0.0.1:notaport"); err == nil {
		t.Fatal("Listen accepted a bad address")
	}
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if _, err := Listen(addr); err == nil {
		t.Fatal("a second Listen on a bound port succeeded")
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v", err)
	}
	// Nothing listens on addr any more: the dial is refused, not hung.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := (Dialer{}).DialContext(ctx, addr); err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	// A cancelled context stops the dial.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := (Dialer{}).DialContext(cctx, "127.0.0.1:9"); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with a cancelled context = %v", err)
	}
}

func TestFixBuffer(t *testing.T) {
	for _, tc := range []struct {
		max  int64
		want bool
	}{
		{-1, false},     // unknown: leave autotuning on
		{212992, false}, // stock Linux: the request would be clamped to ~416 KiB
		{SocketBuffer - 1, false},
		{SocketBuffer, true},
		{64 << 20, true},
	} {
		if got := fixBuffer(tc.max); got != tc.want {
			t.Errorf("fixBuffer(%d) = %v, want %v", tc.max, got, tc.want)
		}
	}
}
