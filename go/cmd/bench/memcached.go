//go:build linux

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// A minimal memcached text-protocol client (set, get, and the meta "mg" for exist) over one
// TCP connection per worker. Calls of n items are pipelined. memcached's default item limit
// is 1 MiB including overhead: start it with -I 8m for 1 MiB values.

// mcLineError classifies memcached's generic error lines; nil when line is not one.
func mcLineError(line []byte) error {
	switch {
	case bytes.Equal(line, []byte("ERROR")):
		return fmt.Errorf("%w: memcached: ERROR (unknown command)", errProto)
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR")):
		return fmt.Errorf("%w: memcached: %s", errProto, line)
	case bytes.HasPrefix(line, []byte("SERVER_ERROR")):
		// e.g. "object too large for cache", "out of memory storing object": the item
		// failed, the stream is intact.
		return replyError{"memcached: " + string(line)}
	}
	return nil
}

// mcStoreReply reads the reply to a set.
func mcStoreReply(br *bufio.Reader) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	switch {
	case bytes.Equal(line, []byte("STORED")):
		return nil
	case bytes.Equal(line, []byte("NOT_STORED")):
		return replyError{"memcached: NOT_STORED"}
	}
	if err := mcLineError(line); err != nil {
		return err
	}
	return fmt.Errorf("%w: memcached set reply %q", errProto, line)
}

// mcGetReply reads the reply to "get key": END alone is a miss (errMiss); a VALUE block
// must name key and is read into buf, whose length it must equal exactly.
func mcGetReply(br *bufio.Reader, key, buf []byte) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	if bytes.Equal(line, []byte("END")) {
		return errMiss
	}
	if err := mcLineError(line); err != nil {
		return err
	}
	// VALUE <key> <flags> <bytes> [<cas unique>]
	rest, ok := bytes.CutPrefix(line, []byte("VALUE "))
	if !ok {
		return fmt.Errorf("%w: memcached get reply %q", errProto, line)
	}
	k, rest, _ := bytes.Cut(rest, []byte(" "))
	_, rest, _ = bytes.Cut(rest, []byte(" ")) // flags
	nb, _, _ := bytes.Cut(rest, []byte(" "))
	n, err := parseInt(nb)
	if err != nil || n < 0 {
		return fmt.Errorf("%w: memcached VALUE line %q", errProto, line)
	}
	if !bytes.Equal(k, key) {
		return fmt.Errorf("%w: memcached answered key %q for %q", errProto, k, key)
	}
	var short error
	if n != int64(len(buf)) {
		short = replyError{fmt.Sprintf("memcached: %d-byte value, want %d", n, len(buf))}
		if _, err := br.Discard(int(n)); err != nil {
			return err
		}
	} else if _, err := io.ReadFull(br, buf); err != nil {
		return err
	}
	if line, err = readLine(br); err != nil {
		return err
	} else if len(line) != 0 {
		return fmt.Errorf("%w: memcached data block not CRLF-terminated", errProto)
	}
	if line, err = readLine(br); err != nil {
		return err
	} else if !bytes.Equal(line, []byte("END")) {
		return fmt.Errorf("%w: memcached get: %q where END was expected", errProto, line)
	}
	return short
}

// mcMetaReply reads the reply to a flagless "mg key": HD (hit, "OK" before 1.6.10) or EN.
func mcMetaReply(br *bufio.Reader) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	switch {
	case bytes.Equal(line, []byte("HD")), bytes.Equal(line, []byte("OK")):
		return nil
	case bytes.Equal(line, []byte("EN")):
		return errMiss
	}
	if err := mcLineError(line); err != nil {
		return err
	}
	return fmt.Errorf("%w: memcached mg reply %q", errProto, line)
}

type mcConn struct {
	nc      net.Conn
	br      *bufio.Reader
	timeout time.Duration
	cmd     []byte
	offs    []int
	bufs    net.Buffers
}

func dialMemcached(cfg targetConfig) (conn, error) {
	nc, err := net.DialTimeout("tcp", cfg.addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &mcConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), timeout: cfg.ioTimeout,
		cmd: make([]byte, 0, 4096), offs: make([]int, 0, cfg.batch+1)}, nil
}

func (m *mcConn) close() error { return m.nc.Close() }

func (m *mcConn) put(keys, vals [][]byte, res []error) error {
	_ = m.nc.SetDeadline(time.Now().Add(m.timeout))
	m.cmd, m.offs = m.cmd[:0], m.offs[:0]
	for i, k := range keys {
		m.offs = append(m.offs, len(m.cmd))
		m.cmd = append(m.cmd, "set "...)
		m.cmd = append(m.cmd, k...)
		m.cmd = append(m.cmd, " 0 0 "...)
		m.cmd = strconv.AppendInt(m.cmd, int64(len(vals[i])), 10)
		m.cmd = append(m.cmd, '\r', '\n')
	}
	m.offs = append(m.offs, len(m.cmd))
	m.bufs = m.bufs[:0]
	for i := range keys {
		m.bufs = append(m.bufs, m.cmd[m.offs[i]:m.offs[i+1]], vals[i], crlf)
	}
	b := m.bufs
	_, err := b.WriteTo(m.nc)
	clear(m.bufs)
	if err != nil {
		return err
	}
	for i := range keys {
		err := mcStoreReply(m.br)
		if !recoverable(err) {
			return err
		}
		res[i] = err
	}
	return nil
}

func (m *mcConn) get(keys, bufs [][]byte, res []error) error {
	_ = m.nc.SetDeadline(time.Now().Add(m.timeout))
	m.cmd = m.cmd[:0]
	for _, k := range keys {
		m.cmd = append(m.cmd, "get "...)
		m.cmd = append(m.cmd, k...)
		m.cmd = append(m.cmd, '\r', '\n')
	}
	if _, err := m.nc.Write(m.cmd); err != nil {
		return err
	}
	for i, k := range keys {
		err := mcGetReply(m.br, k, bufs[i])
		if !recoverable(err) {
			return err
		}
		res[i] = err
	}
	return nil
}

func (m *mcConn) exist(keys [][]byte, res []error) error {
	_ = m.nc.SetDeadline(time.Now().Add(m.timeout))
	m.cmd = m.cmd[:0]
	for _, k := range keys {
		m.cmd = append(m.cmd, "mg "...)
		m.cmd = append(m.cmd, k...)
		m.cmd = append(m.cmd, '\r', '\n')
	}
	if _, err := m.nc.Write(m.cmd); err != nil {
		return err
	}
	for i := range keys {
		err := mcMetaReply(m.br)
		if !recoverable(err) {
			return err
		}
		res[i] = err
	}
	return nil
}
