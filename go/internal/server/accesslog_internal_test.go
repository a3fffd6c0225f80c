package server

import (
	"encoding/json"
	"testing"
)

// FuzzAppendJSONString: every string renders as valid JSON that decodes back to the
// string (invalid UTF-8 bytes as U+FFFD, like encoding/json).
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1:5", `"\`, "\x00\x1f\x7f", "ünï\u2028", "\xff\xfe", "a\nb\tc\r"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString([]byte("x"), s)
		if b[0] != 'x' {
			t.Fatal("prefix overwritten")
		}
		var got string
		if err := json.Unmarshal(b[1:], &got); err != nil {
			t.Fatalf("%q rendered as invalid JSON %q: %v", s, b[1:], err)
		}
		// encoding/json's own rendering, decoded, is the reference.
		var want string
		raw, _ := json.Marshal(s)
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%q decoded as %q, want %q", s, got, want)
		}
	})
}
