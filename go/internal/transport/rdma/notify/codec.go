package notify

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the bytes before a notification's name: kind u8, version u8, name length
// u16, returned credits u16, reserved u16 (all little endian).
const HeaderSize = 8

// MaxName bounds a notification's name.
const MaxName = 255

const (
	version    = 1
	kindMsg    = 1 // a notification: name, body, piggybacked credits
	kindCredit = 2 // credits only (sent into the peer's reserve buffers)
)

// ErrMalformed: bytes that are not a notification.
var ErrMalformed = errors.New("notify: malformed notification")

// encode writes a notification into b (which must hold HeaderSize+len(name)+len(body)).
func encode(b []byte, kind uint8, credits uint16, name string, body []byte) int {
	b[0], b[1] = kind, version
	binary.LittleEndian.PutUint16(b[2:], uint16(len(name)))
	binary.LittleEndian.PutUint16(b[4:], credits)
	binary.LittleEndian.PutUint16(b[6:], 0)
	n := HeaderSize + copy(b[HeaderSize:], name)
	return n + copy(b[n:], body)
}

// decode parses a notification; name and body alias b.
func decode(b []byte) (kind uint8, credits uint16, name, body []byte, err error) {
	if len(b) < HeaderSize {
		return 0, 0, nil, nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	kind, credits = b[0], binary.LittleEndian.Uint16(b[4:])
	nl := int(binary.LittleEndian.Uint16(b[2:]))
	switch {
	case b[1] != version:
		return 0, 0, nil, nil, fmt.Errorf("%w: version %d", ErrMalformed, b[1])
	case binary.LittleEndian.Uint16(b[6:]) != 0:
		return 0, 0, nil, nil, fmt.Errorf("%w: reserved bits set", ErrMalformed)
	case kind == kindCredit:
		if nl != 0 || len(b) != HeaderSize {
			return 0, 0, nil, nil, fmt.Errorf("%w: credit message with %d bytes", ErrMalformed, len(b))
		}
		return kind, credits, nil, nil, nil
	case kind != kindMsg:
		return 0, 0, nil, nil, fmt.Errorf("%w: kind %d", ErrMalformed, kind)
	case nl == 0 || nl > MaxName || nl > len(b)-HeaderSize:
		return 0, 0, nil, nil, fmt.Errorf("%w: name of %d bytes in %d", ErrMalformed, nl, len(b))
	}
	return kind, credits, b[HeaderSize : HeaderSize+nl], b[HeaderSize+nl:], nil
}

// checkName refuses names a peer would refuse.
func checkName(name string) error {
	if len(name) == 0 || len(name) > MaxName {
		return fmt.Errorf("notify: name of %d bytes (1..%d): %w", len(name), MaxName, ErrInvalid)
	}
	return nil
}

// AppendFrame appends the out-of-band (TCP fallback) encoding of a notification: the
// same bytes a native one carries, without credits.
func AppendFrame(dst []byte, name string, body []byte) ([]byte, error) {
	if err := checkName(name); err != nil {
		return dst, err
	}
	n := len(dst)
	dst = append(dst, make([]byte, HeaderSize+len(name)+len(body))...)
	encode(dst[n:], kindMsg, 0, name, body)
	return dst, nil
}

// DecodeFrame parses AppendFrame's encoding; name and body alias b.
func DecodeFrame(b []byte) (name string, body []byte, err error) {
	kind, credits, nm, bd, err := decode(b)
	if err != nil {
		return "", nil, err
	}
	if kind != kindMsg || credits != 0 {
		return "", nil, fmt.Errorf("%w: out-of-band frame kind %d credits %d", ErrMalformed, kind, credits)
	}
	return string(nm), bd, nil
}
