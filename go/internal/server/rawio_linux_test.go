package server

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection: the accepted end wrapped by
// newRawConn, and the dialed end as it is.
func tcpPair(t *testing.T) (*rawConn, *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ac, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := newRawConn(ac).(*rawConn)
	if !ok {
		t.Fatalf("newRawConn(%T) did not wrap a TCP connection", ac)
	}
	t.Cleanup(func() { rc.Close(); dc.Close() })
	return rc, dc.(*net.TCPConn)
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestRawConnPassesOtherConnsThrough(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := newRawConn(a); got != a {
		t.Fatalf("newRawConn(net.Pipe) = %T, want the conn unchanged", got)
	}
}

// Gathered writes far larger than the socket buffers (so that sendmsg returns short counts
// and EAGAIN and the netpoller waits for room) arrive whole and in order, and reads of a
// stream written in odd pieces return every byte.
func TestRawConnStreams(t *testing.T) {
	rc, peer := tcpPair(t)
	// Segments of odd sizes, an empty one included, 24 MiB in all.
	segs := [][]byte{randBytes(17, 1), nil, randBytes(8<<20+3, 2), randBytes(1, 3), randBytes(16<<20-21, 4)}
	want := bytes.Join(segs, nil)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		// Small reads: the writer outruns the reader and has to wait for room.
		off := 0
		for off < len(b) {
			n, err := peer.Read(b[off:min(len(b), off+4096)])
			if err != nil {
				got <- nil
				return
			}
			off += n
		}
		got <- b
	}()
	rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	n, err := rc.writeBuffers(segs)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("writeBuffers = %d, %v; want %d, nil", n, err, len(want))
	}
	if b := <-got; b == nil || crc32.ChecksumIEEE(b) != crc32.ChecksumIEEE(want) {
		t.Fatal("the peer read different bytes than were written")
	}
	for i, v := range rc.wiov[:cap(rc.wiov)] {
		if v.Base != nil {
			t.Fatalf("iovec %d still points at the caller's memory after the write", i)
		}
	}

	// The other direction, through Read.
	src := randBytes(5<<20+7, 9)
	go func() {
		for off := 0; off < len(src); off += 100_003 {
			if _, err := peer.Write(src[off:min(len(src), off+100_003)]); err != nil {
				return
			}
		}
	}()
	rc.SetReadDeadline(time.Now().Add(30 * time.Second))
	dst := make([]byte, len(src))
	// The first half in reads no larger than the reader buffer (raw system calls), the rest
	// in one bulk read (net.Conn's path).
	half := len(dst) / 2
	for off := 0; off < half; {
		n, err := rc.Read(dst[off:min(half, off+readBufSize)])
		if err != nil {
			t.Fatalf("Read at %d: %v", off, err)
		}
		off += n
	}
	if _, err := io.ReadFull(rc, dst[half:]); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("ReadFull: %v (equal %v)", err, bytes.Equal(dst, src))
	}
	if n, err := rc.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
	// Write is writeBuffers of one segment.
	if n, err := rc.Write([]byte("tail")); n != 4 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	tail := make([]byte, 4)
	if _, err := io.ReadFull(peer, tail); err != nil || string(tail) != "tail" {
		t.Fatalf("peer read %q, %v", tail, err)
	}
}

// Deadlines, Close, end of stream and a reset surface as net.Conn's errors do.
func TestRawConnErrors(t *testing.T) {
	t.Run("read deadline", func(t *testing.T) {
		rc, _ := tcpPair(t)
		start := time.Now()
		rc.SetReadDeadline(start.Add(50 * time.Millisecond))
		_, err := rc.Read(make([]byte, 10))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past the deadline: %v; want a timeout", err)
		}
		if time.Since(start) < 50*time.Millisecond {
			t.Fatalf("Read returned %v before its deadline", time.Since(start))
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("error %v: want a *net.OpError named read", err)
		}
	})
	t.Run("write deadline", func(t *testing.T) {
		rc, _ := tcpPair(t) // the peer never reads
		big := make([]byte, 256<<20)
		rc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := rc.writeBuffers([][]byte{big})
		if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= int64(len(big)) {
			t.Fatalf("writeBuffers to a peer that does not read = %d, %v; want a partial count and a timeout", n, err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" {
			t.Fatalf("error %v: want a *net.OpError named write", err)
		}
	})
	t.Run("close wakes a blocked read", func(t *testing.T) {
		rc, _ := tcpPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := rc.Read(make([]byte, 10))
			done <- err
		}()
		time.AfterFunc(20*time.Millisecond, func() { rc.Close() })
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read after Close: %v; want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not wake the blocked Read")
		}
	})
	t.Run("end of stream", func(t *testing.T) {
		rc, peer := tcpPair(t)
		peer.Write([]byte("ab"))
		peer.Close()
		b, err := io.ReadAll(rc)
		if err != nil || string(b) != "ab" {
			t.Fatalf("ReadAll = %q, %v", b, err)
		}
		if _, err := rc.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("Read at the end: %v; want io.EOF", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		rc, peer := tcpPair(t)
		peer.SetLinger(0) // close sends RST
		peer.Close()
		rc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := rc.Read(make([]byte, 1))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Read after the peer's reset: %v; want ECONNRESET", err)
		}
		// A write to the dead connection fails with an error (EPIPE or ECONNRESET), and no
		// SIGPIPE ends the test binary (MSG_NOSIGNAL).
		rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		var err2 error
		for i := 0; i < 3 && err2 == nil; i++ {
			_, err2 = rc.Write(make([]byte, 1<<20))
		}
		if !errors.Is(err2, syscall.EPIPE) && !errors.Is(err2, syscall.ECONNRESET) {
			t.Fatalf("Write after the peer's reset: %v; want EPIPE or ECONNRESET", err2)
		}
	})
}
