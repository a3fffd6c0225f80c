package onesided

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
)

// Bootstrap frames on the TCP connection: kind u8, length u32 LE, body.
const (
	frameTail    = 1
	frameRefusal = 2
	maxFrame     = dcp.MaxTailBytes
)

func writeFrame(c net.Conn, kind byte, body []byte, timeout time.Duration) error {
	b := make([]byte, 5+len(body))
	b[0] = kind
	binary.LittleEndian.PutUint32(b[1:], uint32(len(body)))
	copy(b[5:], body)
	c.SetWriteDeadline(time.Now().Add(timeout))
	defer c.SetWriteDeadline(time.Time{})
	_, err := c.Write(b)
	return err
}

func readFrame(c net.Conn, timeout time.Duration) (byte, []byte, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	var h [5]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(h[1:])
	if h[0] != frameTail && h[0] != frameRefusal {
		return 0, nil, fmt.Errorf("onesided: bootstrap frame kind %d", h[0])
	}
	if n > maxFrame {
		return 0, nil, fmt.Errorf("onesided: bootstrap frame of %d bytes (max %d)", n, maxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return 0, nil, err
	}
	return h[0], body, nil
}

// target is one GET destination: 16 bytes in the request slot after the prefix.
type target struct {
	addr uint64
	rkey uint32
	len  uint32
}

const targetSize = 16

func putTarget(b []byte, t target) {
	binary.LittleEndian.PutUint64(b, t.addr)
	binary.LittleEndian.PutUint32(b[8:], t.rkey)
	binary.LittleEndian.PutUint32(b[12:], t.len)
}

func getTarget(b []byte) target {
	return target{addr: binary.LittleEndian.Uint64(b), rkey: binary.LittleEndian.Uint32(b[8:]), len: binary.LittleEndian.Uint32(b[12:])}
}
