package inmem

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func dialPair(t *testing.T, n *Network, addr string) (client, server net.Conn) {
	t.Helper()
	l, err := n.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			acc <- c
		}
	}()
	c, err := n.Dialer().DialContext(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-acc:
		return c, s
	case <-time.After(5 * time.Second):
		t.Fatal("accept never returned")
	}
	return nil, nil
}

func TestRoundTripBothWaysAtOnce(t *testing.T) {
	n := NewNetwork()
	c, s := dialPair(t, n, "a:1")
	// Both ends write 1 MiB before reading: buffered pipes must not deadlock.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	errc := make(chan error, 2)
	for _, w := range []net.Conn{c, s} {
		go func() { _, err := w.Write(big); errc <- err }()
	}
	for _, r := range []net.Conn{c, s} {
		got := make([]byte, len(big))
		if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("read: %v", err)
		}
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the peer closed = %v, want EOF", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close = %v", err)
	}
}

func TestDeadlines(t *testing.T) {
	n := NewNetwork()
	c, _ := dialPair(t, n, "a:1")
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline = %v", err)
	}
	// Moving the deadline wakes a blocked reader.
	c.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); done <- err }()
	c.SetReadDeadline(time.Now().Add(-time.Second))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a past deadline did not wake the reader")
	}
}

func TestFaults(t *testing.T) {
	n := NewNetwork()
	c, s := dialPair(t, n, "a:1")

	n.Blackhole("a:1")
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := s.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a black-holed write arrived: %v", err)
	}
	n.Heal("a:1")
	s.SetReadDeadline(time.Time{})
	c.Write([]byte("ok"))
	if got := readN(t, s, 2); got != "ok" {
		t.Fatalf("after heal: %q", got)
	}

	n.Delay("a:1", 50*time.Millisecond)
	start := time.Now()
	c.Write([]byte("slow"))
	if got := readN(t, s, 4); got != "slow" || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("delayed write: %q after %v", got, time.Since(start))
	}
	n.Heal("a:1")

	n.Partition("a:1")
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a partitioned connection = %v", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a partitioned connection = %v", err)
	}
	if _, err := n.Dialer().DialContext(context.Background(), "a:1"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial into a partition = %v", err)
	}
	n.Heal("a:1")
	c2, s2 := dialPairExisting(t, n, "a:1")
	c2.Write([]byte("hi"))
	if got := readN(t, s2, 2); got != "hi" {
		t.Fatalf("after the partition healed: %q", got)
	}
	if _, err := n.Dialer().DialContext(context.Background(), "nobody:1"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial to no listener = %v", err)
	}
}

func readN(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	b := make([]byte, n)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dialPairExisting dials a listener that dialPair already opened.
func dialPairExisting(t *testing.T, n *Network, addr string) (net.Conn, net.Conn) {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	acc := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			acc <- c
		}
	}()
	c, err := n.Dialer().DialContext(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return c, <-acc
}
