package tcp

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A dialed connection has its receive buffer fixed exactly when the sysctl maximum lets
// SocketBuffer through, and is left to autotuning otherwise (a stock rmem_max would clamp
// the request, and the socket would keep that clamped size).
func TestDialAppliesBufferPolicy(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dialer{}.DialContext(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var rcv int
	var gerr error
	rc.Control(func(fd uintptr) { rcv, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	max := sysMax("/proc/sys/net/core/rmem_max")
	fixRead, _ := bufferPolicy()
	if fixRead != fixBuffer(max) {
		t.Fatalf("fixRead = %v with rmem_max %d", fixRead, max)
	}
	// What a SetReadBuffer(SocketBuffer) leaves: twice the request, clamped to the maximum.
	set := 2 * int(min(SocketBuffer, max))
	if fixed := rcv == set; fixed != fixRead {
		t.Fatalf("SO_RCVBUF = %d with rmem_max %d: set by tune %v, want %v", rcv, max, fixed, fixRead)
	}
}
