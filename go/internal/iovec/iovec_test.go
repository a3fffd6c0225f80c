package iovec

import (
	"bytes"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rest is what iov still covers, as bytes.
func rest(iov []unix.Iovec) []byte {
	var out []byte
	for _, v := range iov {
		out = append(out, unsafe.Slice(v.Base, int(v.Len))...)
	}
	return out
}

func TestAppendAndAdvance(t *testing.T) {
	segs := [][]byte{[]byte("abc"), nil, []byte("d"), {}, []byte("efghij")}
	all := bytes.Join(segs, nil)
	for n := 0; n <= len(all)+2; n++ {
		iov, total := Append(nil, segs)
		if total != len(all) || len(iov) != 3 {
			t.Fatalf("Append: %d entries, total %d; want 3, %d", len(iov), total, len(all))
		}
		got := rest(Advance(iov, n))
		want := all[min(n, len(all)):]
		if !bytes.Equal(got, want) {
			t.Fatalf("Advance(%d) leaves %q, want %q", n, got, want)
		}
	}
	// Appends after what dst holds.
	iov, _ := Append(make([]unix.Iovec, 1, 4), segs[:1])
	if len(iov) != 2 {
		t.Fatalf("Append onto one entry: %d entries", len(iov))
	}
}

func TestMsghdrCapsAtMax(t *testing.T) {
	one := []byte{1}
	segs := make([][]byte, Max+5)
	for i := range segs {
		segs[i] = one
	}
	iov, _ := Append(nil, segs)
	if m := Msghdr(iov); int(m.Iovlen) != Max || m.Iov != &iov[0] {
		t.Fatalf("Msghdr over %d entries: Iovlen %d", len(iov), m.Iovlen)
	}
	if m := Msghdr(iov[:3]); int(m.Iovlen) != 3 {
		t.Fatalf("Msghdr over 3 entries: Iovlen %d", m.Iovlen)
	}
}
