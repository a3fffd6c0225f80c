package client

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/iovec"
)

// fdConn is a connection whose I/O is blocking system calls on the calling thread (see
// Options.BlockingIO). A caller that entered Go from a foreign thread (the C ABI) is locked
// to that thread: every netpoller wait parks it and needs another thread to wake it up, a
// scheduler round trip per partial read of a large reply. Here the thread sleeps in the
// kernel instead, and reads land straight in the caller's buffers with MSG_WAITALL, so a
// whole value is normally one recvmsg.
//
// Deadlines: SO_RCVTIMEO/SO_SNDTIMEO bound each system call; before each one the remaining
// time to the deadline is compared with the armed timeout and the socket option is lowered
// when the call could otherwise overrun the deadline by more than an eighth of what
// remains. The steady state (one deadline per request, same length every time) makes no
// setsockopt at all.
type fdConn struct {
	fd       int
	deadline time.Time
	armed    time.Duration // SO_RCVTIMEO/SO_SNDTIMEO in force; 0: none yet
	iov      []unix.Iovec
	closed   bool
}

// blockingSupported: Options.BlockingIO has an effect.
const blockingSupported = true

// blockingConn turns a dialed socket into an fdConn. It returns (nil, nil) when nc is not a
// kernel socket (an in-memory transport), which keeps the netpoller path.
func blockingConn(nc net.Conn) (*fdConn, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("blocking I/O: %w", err)
	}
	if derr != nil {
		return nil, fmt.Errorf("blocking I/O: dup: %w", derr)
	}
	// The duplicate shares the socket; closing the net.Conn only drops its descriptor (and
	// its netpoller registration).
	nc.Close()
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("blocking I/O: %w", err)
	}
	return &fdConn{fd: fd}, nil
}

// detach gives up the descriptor: the caller owns it, and Close no longer closes it.
func (f *fdConn) detach() int {
	f.closed = true
	return f.fd
}

func (f *fdConn) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	return unix.Close(f.fd)
}

// interrupt wakes a system call blocked on the socket from another goroutine: a deadline
// cannot (SO_RCVTIMEO is read when the call starts), a shutdown can. The blocked call
// returns end-of-stream or EPIPE and the connection is finished.
func (f *fdConn) interrupt() {
	_ = unix.Shutdown(f.fd, unix.SHUT_RDWR)
}

func (f *fdConn) SetDeadline(t time.Time) error {
	f.deadline = t
	return nil
}

// arm makes sure the next system call cannot block much past the deadline.
func (f *fdConn) arm() error {
	if f.closed {
		return net.ErrClosed
	}
	if f.deadline.IsZero() {
		return nil
	}
	rem := time.Until(f.deadline)
	if rem <= 0 {
		return os.ErrDeadlineExceeded
	}
	if f.armed != 0 && f.armed <= rem+rem/8 && f.armed >= rem/2 {
		return nil
	}
	tv := unix.NsecToTimeval(max(rem.Nanoseconds(), int64(time.Microsecond)))
	if err := unix.SetsockoptTimeval(f.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("SO_RCVTIMEO: %w", err)
	}
	if err := unix.SetsockoptTimeval(f.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fmt.Errorf("SO_SNDTIMEO: %w", err)
	}
	f.armed = rem
	return nil
}

// retry reports whether a failed call may be repeated: EINTR, or a socket timeout that
// fired before the deadline (armed for less than what remains).
func (f *fdConn) retry(errno syscall.Errno) (bool, error) {
	switch errno {
	case unix.EINTR:
		return true, nil
	case unix.EAGAIN:
		if !f.deadline.IsZero() && time.Until(f.deadline) > 0 {
			f.armed = 0 // re-arm with what remains
			return true, nil
		}
		return false, os.ErrDeadlineExceeded
	}
	return false, errno
}

// Read is one recv of whatever has arrived (for the buffered reader).
func (f *fdConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if err := f.arm(); err != nil {
			return 0, err
		}
		n, _, e := syscall.Syscall6(unix.SYS_RECVFROM, uintptr(f.fd), uintptr(unsafe.Pointer(&p[0])),
			uintptr(len(p)), 0, 0, 0)
		if e == 0 {
			if n == 0 {
				return 0, io.EOF
			}
			return int(n), nil
		}
		if again, err := f.retry(e); !again {
			return 0, err
		}
	}
}

// Write sends all of p.
func (f *fdConn) Write(p []byte) (int, error) {
	if err := f.writev([][]byte{p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// readv fills segs completely, in order (recvmsg with MSG_WAITALL: usually one call).
func (f *fdConn) readv(segs [][]byte) error {
	return f.vectored(segs, unix.SYS_RECVMSG, unix.MSG_WAITALL)
}

// writev sends every segment in order (sendmsg; MSG_NOSIGNAL: a dead peer is EPIPE, not
// a signal in the host process).
func (f *fdConn) writev(segs [][]byte) error {
	return f.vectored(segs, unix.SYS_SENDMSG, unix.MSG_NOSIGNAL)
}

func (f *fdConn) vectored(segs [][]byte, trap, flags uintptr) error {
	f.iov, _ = iovec.Append(f.iov[:0], segs)
	defer clear(f.iov) // do not keep caller memory reachable
	iov := f.iov
	for len(iov) > 0 {
		if err := f.arm(); err != nil {
			return err
		}
		msg := iovec.Msghdr(iov)
		n, _, e := syscall.Syscall(trap, uintptr(f.fd), uintptr(unsafe.Pointer(&msg)), flags)
		if e != 0 {
			if again, err := f.retry(e); !again {
				return err
			}
			continue
		}
		if n == 0 && trap == unix.SYS_RECVMSG {
			return io.ErrUnexpectedEOF
		}
		iov = iovec.Advance(iov, int(n))
	}
	return nil
}
