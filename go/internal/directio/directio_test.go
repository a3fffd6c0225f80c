//go:build linux

package directio

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	fd, err := Open(path, unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := Open(path, unix.O_CREAT|unix.O_EXCL, 0o600); err == nil {
		t.Fatal("O_EXCL open of an existing file succeeded")
	}
	buf, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := append([]byte(nil), buf...)
	if err := WriteFull(fd, buf, 4096); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	if err := ReadFull(fd, buf, 4096); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("read back: %v", err)
	}
	// Reading past the end is a short read, reported rather than returned as zeros.
	if err := ReadFull(fd, buf, 8192); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past end: %v", err)
	}
}
