package server

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/iovec"
)

// rawConn serves a plaintext TCP connection with non-blocking reads (up to the reader
// buffer's size; see Read) and writes issued as raw system calls, waiting on the netpoller (through syscall.RawConn) only when the socket
// is not ready.
//
// Why: net.Conn's Read and Write go through syscall.Syscall, whose entersyscall wakes the
// runtime's sysmon thread whenever it sleeps, and sysmon sleeps whenever every P went idle:
// between two requests of a client that waits for each reply. On a small GET that was an
// extra futex wake-up, thread switch and CPU migration per request, about a quarter of
// the server's CPU per 4 KiB GET (docs/BENCHMARKS.md, issue 17). A non-blocking socket call
// never blocks, so it does not need entersyscall: the P it runs on stays busy for the few
// microseconds the copy takes, as for any other Go code. Deadlines, Close waking a blocked
// reader and the error values are those of net.Conn (RawConn.Read/Write honour them).
type rawConn struct {
	*net.TCPConn
	rc syscall.RawConn

	// State of the call in progress, read by the prebuilt callbacks (no closure per call).
	// Reads and writes may run at once (the reader and a PUT's reply), so each has its own.
	rbuf  []byte
	rn    int
	rerr  error
	wiov  []unix.Iovec
	wn    int64
	werr  error
	readF func(fd uintptr) bool
	wrF   func(fd uintptr) bool
}

// newRawConn wraps nc when it is a plain TCP connection; otherwise it returns nc.
func newRawConn(nc net.Conn) net.Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc
	}
	c := &rawConn{TCPConn: tc, rc: rc}
	c.readF = c.readOnce
	c.wrF = c.writeOnce
	return c
}

func (c *rawConn) readOnce(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn, c.rerr = int(n), nil
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			c.rn, c.rerr = 0, e
			return true
		}
	}
}

// Read is one read of what has arrived, waiting for data if there is none. A read larger
// than the connection's reader buffer is a bulk payload read straight into its destination
// (a PUT's value): that one takes net.Conn's path. Made raw, write-back PUTs sustained only
// 0.72-0.83x the rate (docs/BENCHMARKS.md, issue 17); the likely cause is that a payload's
// reads then never give the scheduler a system call at which to hand the P to the
// flushers, whose disk writes set that rate.
func (c *rawConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > readBufSize {
		return c.TCPConn.Read(p)
	}
	c.rbuf = p
	err := c.rc.Read(c.readF)
	c.rbuf = nil
	if err != nil {
		return 0, renameOp(err, "read") // closed, or past the deadline (Timeout)
	}
	if c.rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(),
			Err: os.NewSyscallError("read", c.rerr)}
	}
	if c.rn == 0 {
		return 0, io.EOF
	}
	return c.rn, nil
}

func (c *rawConn) writeOnce(fd uintptr) bool {
	for len(c.wiov) > 0 { // Append leaves no empty entry, Advance drops finished ones
		msg := iovec.Msghdr(c.wiov)
		n, _, e := syscall.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_NOSIGNAL)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			c.werr = e
			return true
		}
		c.wn += int64(n)
		c.wiov = iovec.Advance(c.wiov, int(n))
	}
	return true
}

// writeBuffers sends every segment in order, gathered (sendmsg), waiting for room as needed.
func (c *rawConn) writeBuffers(segs [][]byte) (int64, error) {
	iov, total := iovec.Append(c.wiov[:0], segs)
	if total == 0 {
		return 0, nil
	}
	c.wiov, c.wn, c.werr = iov, 0, nil
	err := c.rc.Write(c.wrF)
	clear(iov) // do not keep the caller's memory reachable
	c.wiov = iov[:0]
	if err != nil {
		return c.wn, renameOp(err, "write") // closed, or past the deadline (Timeout)
	}
	if c.werr != nil {
		return c.wn, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(),
			Err: os.NewSyscallError("sendmsg", c.werr)}
	}
	return c.wn, nil
}

func (c *rawConn) Write(p []byte) (int, error) {
	var one [1][]byte
	one[0] = p
	n, err := c.writeBuffers(one[:])
	return int(n), err
}

// renameOp names a RawConn failure ("raw-read") after the operation the caller asked for.
func renameOp(err error, op string) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
	}
	return err
}
