package testutil

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// OverrunString returns frame with the length of its FlatBuffers string s rewritten to run
// 16 bytes past the frame's end, in a backing array that holds 16 more bytes ('X') after
// the frame: a decoder that slices within the capacity instead of the length reads those
// bytes back instead of failing. s must occur once in frame, right after its length.
func OverrunString(frame []byte, s string) ([]byte, error) {
	at := bytes.Index(frame, []byte(s))
	if at < 4 || bytes.Count(frame, []byte(s)) != 1 {
		return nil, fmt.Errorf("testutil: %q is not once in the frame after a length", s)
	}
	if n := binary.LittleEndian.Uint32(frame[at-4:]); n != uint32(len(s)) {
		return nil, fmt.Errorf("testutil: %q is preceded by length %d", s, n)
	}
	back := append(append([]byte(nil), frame...), bytes.Repeat([]byte("X"), 16)...)
	binary.LittleEndian.PutUint32(back[at-4:], uint32(len(frame)-at+16))
	return back[:len(frame)], nil
}
