package sysfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestInt(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string
		want    int64
		bad     bool
	}{
		{"212992\n", 212992, false},
		{"  4194304 \n", 4194304, false},
		{"-1\n", -1, false},
		{"", 0, true},
		{"2097152 kB\n", 0, true},
		{"0x10\n", 0, true},
	} {
		p := filepath.Join(dir, strconv.Quote(tc.content))
		if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := Int(p)
		if tc.bad {
			if err == nil {
				t.Errorf("Int(%q) = %d, want an error", tc.content, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Int(%q) = %d, %v; want %d", tc.content, got, err, tc.want)
		}
	}
	if _, err := Int(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}
