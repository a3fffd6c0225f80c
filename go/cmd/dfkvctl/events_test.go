package main

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func frames(t *testing.T, seq uint64, batch any) [][]byte {
	t.Helper()
	p, err := msgpack.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte("kv@n1@m"), s[:], p}
}

func TestFormatFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch any
	}{
		{"array", []any{1.0, []any{[]any{"BlockStored", []any{[]byte{0xab}}, nil, []any{}, 16, nil, "CPU"}}, 0}},
		{"map", []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte{0xab}}, "medium": "CPU"}}, 0}},
		{"map-all", map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte{0xab}}, "medium": "CPU"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines, seq := formatFrames("n1", frames(t, 3, tc.batch), 2)
			if seq != 3 || len(lines) != 1 || !strings.Contains(lines[0], "BlockStored\thashes=ab\tmedium=CPU") {
				t.Fatalf("seq %d lines %q", seq, lines)
			}
		})
	}
	lines, _ := formatFrames("n1", frames(t, 7, []any{1.0, []any{[]any{"BlockRemoved", []any{int64(5)}, "CPU"}}, 0}), 3)
	if len(lines) != 2 || !strings.Contains(lines[0], "GAP\tmissed seq 4..6") || !strings.Contains(lines[1], "BlockRemoved\thashes=5") {
		t.Fatalf("gap lines %q", lines)
	}
	lines, seq := formatFrames("n1", frames(t, 0, []any{1.0, []any{[]any{"AllBlocksCleared"}}, 0}), 7)
	if seq != 0 || len(lines) != 2 || !strings.Contains(lines[0], "RESTART\tsequence 0 after 7") || !strings.Contains(lines[1], "AllBlocksCleared") {
		t.Fatalf("restart lines %q", lines)
	}
	if lines, _ := formatFrames("n1", [][]byte{{1}}, 0); !strings.Contains(lines[0], "malformed") {
		t.Fatalf("malformed: %q", lines)
	}
}
