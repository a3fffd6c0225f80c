//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// A minimal RESP2 client (SET/GET/EXISTS with bulk strings) over one TCP connection per
// worker. Calls of n items are pipelined: every command is written, then every reply read.

var errProto = errors.New("protocol error")

// replyError is a failure the server reported in a well-formed reply: the item failed but
// the connection's stream is intact.
type replyError struct{ msg string }

func (e replyError) Error() string { return e.msg }

// recoverable reports whether err left the stream usable (the call goes on with the next
// item); any other error is a failure of the whole call.
func recoverable(err error) bool {
	var re replyError
	return err == nil || errors.Is(err, errMiss) || errors.As(err, &re)
}

// readLine returns the next CRLF-terminated line without its CRLF. The slice is valid until
// the next read from br.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errProto, br.Size())
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: line not CRLF-terminated", errProto)
	}
	return line[:len(line)-2], nil
}

// parseInt parses a signed decimal without allocating.
func parseInt(b []byte) (int64, error) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, fmt.Errorf("%w: bad integer", errProto)
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: bad integer", errProto)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// respReply reads one RESP2 reply. For a bulk string ('$') it reads the payload into buf
// (which must be large enough; a longer payload is consumed and reported as an error) and
// returns its length, -1 for a nil bulk (a miss). For an integer (':') it returns the value,
// for a simple string ('+') 0. An error reply ('-') comes back as an error carrying its text.
func respReply(br *bufio.Reader, buf []byte) (kind byte, n int64, err error) {
	line, err := readLine(br)
	if err != nil {
		return 0, 0, err
	}
	if len(line) == 0 {
		return 0, 0, fmt.Errorf("%w: empty reply line", errProto)
	}
	kind, body := line[0], line[1:]
	switch kind {
	case '+':
		return kind, 0, nil
	case '-':
		return kind, 0, replyError{"redis: " + string(body)}
	case ':':
		n, err = parseInt(body)
		return kind, n, err
	case '$':
		n, err = parseInt(body)
		if err != nil || n < 0 {
			if n < -1 {
				err = fmt.Errorf("%w: bulk length %d", errProto, n)
			}
			return kind, n, err
		}
		if n > int64(len(buf)) {
			if _, err := br.Discard(int(n) + 2); err != nil {
				return kind, n, err
			}
			return kind, n, replyError{fmt.Sprintf("redis: %d-byte value for a %d-byte buffer", n, len(buf))}
		}
		if _, err := io.ReadFull(br, buf[:n]); err != nil {
			return kind, n, err
		}
		var crlf [2]byte
		if _, err := io.ReadFull(br, crlf[:]); err != nil {
			return kind, n, err
		}
		if crlf != [2]byte{'\r', '\n'} {
			return kind, n, fmt.Errorf("%w: bulk not CRLF-terminated", errProto)
		}
		return kind, n, nil
	}
	return kind, 0, fmt.Errorf("%w: unexpected reply type %q", errProto, kind)
}

// appendBulkHeader appends a RESP bulk string header "$<len>\r\n".
func appendBulkHeader(b []byte, n int) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// appendCommand appends "*<argc>\r\n" and the bulk arguments.
func appendCommand(b []byte, args ...[]byte) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = appendBulkHeader(b, len(a))
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

var (
	cmdSET    = []byte("SET")
	cmdGET    = []byte("GET")
	cmdEXISTS = []byte("EXISTS")
	crlf      = []byte("\r\n")
)

type redisConn struct {
	nc      net.Conn
	br      *bufio.Reader
	timeout time.Duration
	cmd     []byte
	offs    []int
	bufs    net.Buffers
}

func dialRedis(cfg targetConfig) (conn, error) {
	nc, err := net.DialTimeout("tcp", cfg.addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &redisConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), timeout: cfg.ioTimeout,
		cmd: make([]byte, 0, 4096), offs: make([]int, 0, cfg.batch+1)}, nil
}

func (r *redisConn) close() error { return r.nc.Close() }

func (r *redisConn) put(keys, vals [][]byte, res []error) error {
	_ = r.nc.SetDeadline(time.Now().Add(r.timeout))
	// Headers first (the buffer may grow while appending), then the gather list.
	r.cmd, r.offs = r.cmd[:0], r.offs[:0]
	for i, k := range keys {
		r.offs = append(r.offs, len(r.cmd))
		r.cmd = append(r.cmd, "*3\r\n"...)
		r.cmd = appendBulkHeader(r.cmd, len(cmdSET))
		r.cmd = append(r.cmd, cmdSET...)
		r.cmd = append(r.cmd, '\r', '\n')
		r.cmd = appendBulkHeader(r.cmd, len(k))
		r.cmd = append(r.cmd, k...)
		r.cmd = append(r.cmd, '\r', '\n')
		r.cmd = appendBulkHeader(r.cmd, len(vals[i]))
	}
	r.offs = append(r.offs, len(r.cmd))
	r.bufs = r.bufs[:0]
	for i := range keys {
		r.bufs = append(r.bufs, r.cmd[r.offs[i]:r.offs[i+1]], vals[i], crlf)
	}
	b := r.bufs
	_, err := b.WriteTo(r.nc)
	clear(r.bufs)
	if err != nil {
		return err
	}
	for i := range keys {
		kind, _, err := respReply(r.br, nil)
		if err == nil && kind != '+' {
			err = fmt.Errorf("%w: SET answered %q", errProto, kind)
		}
		if !recoverable(err) {
			return err // the stream is unusable
		}
		res[i] = err
	}
	return nil
}

func (r *redisConn) get(keys, bufs [][]byte, res []error) error {
	_ = r.nc.SetDeadline(time.Now().Add(r.timeout))
	r.cmd = r.cmd[:0]
	for _, k := range keys {
		r.cmd = appendCommand(r.cmd, cmdGET, k)
	}
	if _, err := r.nc.Write(r.cmd); err != nil {
		return err
	}
	for i := range keys {
		kind, n, err := respReply(r.br, bufs[i])
		switch {
		case err != nil:
		case kind != '$':
			err = fmt.Errorf("%w: GET answered %q", errProto, kind)
		case n < 0:
			err = errMiss
		case n != int64(len(bufs[i])):
			err = replyError{fmt.Sprintf("redis: %d-byte value, want %d", n, len(bufs[i]))}
		}
		if !recoverable(err) {
			return err
		}
		res[i] = err
	}
	return nil
}

func (r *redisConn) exist(keys [][]byte, res []error) error {
	_ = r.nc.SetDeadline(time.Now().Add(r.timeout))
	r.cmd = r.cmd[:0]
	for _, k := range keys {
		r.cmd = appendCommand(r.cmd, cmdEXISTS, k)
	}
	if _, err := r.nc.Write(r.cmd); err != nil {
		return err
	}
	for i := range keys {
		kind, n, err := respReply(r.br, nil)
		if err == nil && kind != ':' {
			err = fmt.Errorf("%w: EXISTS answered %q", errProto, kind)
		}
		if err == nil && n == 0 {
			err = errMiss
		}
		if !recoverable(err) {
			return err
		}
		res[i] = err
	}
	return nil
}
