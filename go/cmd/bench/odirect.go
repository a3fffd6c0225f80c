//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
	"github.com/dfkv/dfkv/go/internal/directio"
	"github.com/dfkv/dfkv/go/internal/store"
)

// The odirect target is the device-speed reference for cold GETs: O_DIRECT preads (and, for
// PUT, O_DIRECT|O_DSYNC pwrites, the durability of the slab engine's payload writes) of
// whole blocks of a preallocated file, with no network, no index and no checksum. Put the
// file on the same file system as the dfkv data directory being compared.
//
// A block is --size rounded up to 4096 (O_DIRECT alignment). Key i of the key space maps
// to block i mod (file size / block): random keys are random block-aligned offsets. Every
// 4096-byte sector of the file carries its sector number in its first 8 bytes (written by
// `dfkv_bench odirect-prep` and kept by PUTs), and with --verify each GET checks its first
// sector's stamp, so a misplaced or short read counts as an error. Buffers come from
// anonymous mmap (page-aligned, populated once, not scanned by the GC); nothing is copied
// after the read.
const sectorSize = store.BlockSize

// stampSectors writes each sector's number (its file offset / 4096) into its first 8 bytes.
func stampSectors(b []byte, off int64) {
	for s := 0; s+8 <= len(b); s += sectorSize {
		binary.LittleEndian.PutUint64(b[s:], uint64(off+int64(s))/sectorSize)
	}
}

func mmapBuf(n int64) ([]byte, error) {
	return unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
}

// odirectPrep runs `dfkv_bench odirect-prep --file F --bytes N`: creates (or rewrites) F with
// N bytes (rounded up to 4096), preallocated and written with O_DIRECT, every sector stamped.
func odirectPrep(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("dfkv_bench odirect-prep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "file to create (put it on the file system under test)")
	total := cli.Size(0)
	fs.Var(&total, "bytes", "file size (bytes; KiB/MiB/GiB suffixes)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitSetup
	}
	if *file == "" || total <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "dfkv_bench odirect-prep: need --file PATH --bytes N (> 0)")
		return exitSetup
	}
	size := store.AlignUp(int64(total))
	start := time.Now()
	if err := prepFile(*file, size); err != nil {
		fmt.Fprintln(stderr, "dfkv_bench odirect-prep:", err)
		return exitSetup
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(stderr, "dfkv_bench odirect-prep: wrote %s (%d bytes) in %.2fs (%.3f GB/s, O_DIRECT|O_DSYNC)\n",
		*file, size, secs, float64(size)/1e9/secs)
	return exitOK
}

func prepFile(path string, size int64) error {
	fd, err := directio.Open(path, unix.O_CREAT, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("truncate %s: %w", path, err)
	}
	if err := unix.Fallocate(fd, 0, 0, size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("fallocate %s: %w", path, err)
	}
	const chunk = 4 << 20
	buf, err := mmapBuf(chunk)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	for j := range buf {
		buf[j] = byte(j*131 + 7)
	}
	for off := int64(0); off < size; off += chunk {
		b := buf[:min(chunk, size-off)]
		stampSectors(b, off)
		if err := directio.WriteFull(fd, b, off); err != nil {
			return fmt.Errorf("write %s at %d: %w", path, off, err)
		}
	}
	return unix.Fsync(fd)
}

// odirectTarget opens one descriptor per worker on --file.
type odirectTarget struct {
	cfg     targetConfig
	block   int64
	nblocks int64
}

func openODirectTarget(cfg targetConfig, size int64) (target, error) {
	if cfg.file == "" {
		return nil, errors.New("--target odirect needs --file PATH (create it with `dfkv_bench odirect-prep`)")
	}
	st, err := os.Stat(cfg.file)
	if err != nil {
		return nil, err
	}
	block := store.AlignUp(size)
	n := st.Size() / block
	if n < 1 {
		return nil, fmt.Errorf("%s holds %d bytes: less than one %d-byte block", cfg.file, st.Size(), block)
	}
	return &odirectTarget{cfg: cfg, block: block, nblocks: n}, nil
}

func (t *odirectTarget) name() string { return "odirect" }
func (t *odirectTarget) close() error { return nil }

func (t *odirectTarget) newConn() (conn, error) {
	fd, err := directio.Open(t.cfg.file, 0, 0)
	if err != nil {
		return nil, err
	}
	c := &odirectConn{t: t, fd: fd, bufs: make([][]byte, max(1, t.cfg.batch))}
	for i := range c.bufs {
		if c.bufs[i], err = mmapBuf(t.block); err != nil {
			c.close()
			return nil, fmt.Errorf("mmap %d bytes: %w", t.block, err)
		}
	}
	return c, nil
}

type odirectConn struct {
	t    *odirectTarget
	fd   int
	bufs [][]byte // one aligned block per batch item
}

func (c *odirectConn) close() error {
	for i, b := range c.bufs {
		if b != nil {
			unix.Munmap(b)
			c.bufs[i] = nil
		}
	}
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	return nil
}

// offset maps a key (ns ":" decimal index) to its block's file offset.
func (c *odirectConn) offset(key []byte) int64 {
	var idx uint64
	for _, ch := range key[max(0, len(key)-keyDigits):] {
		if ch >= '0' && ch <= '9' {
			idx = idx*10 + uint64(ch-'0')
		}
	}
	return int64(idx%uint64(c.t.nblocks)) * c.t.block
}

var errNoExist = errors.New("--target odirect has no exist operation")

func (c *odirectConn) get(keys, bufs [][]byte, res []error) error {
	for i, k := range keys {
		off := c.offset(k)
		b := c.bufs[i]
		if err := directio.ReadFull(c.fd, b, off); err != nil {
			return fmt.Errorf("pread %d bytes at %d: %w", len(b), off, err)
		}
		if c.t.cfg.verify && binary.LittleEndian.Uint64(b) != uint64(off)/sectorSize {
			res[i] = errCorrupt
		}
	}
	return nil
}

func (c *odirectConn) put(keys, vals [][]byte, res []error) error {
	for i, k := range keys {
		off := c.offset(k)
		b := c.bufs[i]
		copy(b, vals[i]) // the copy into an aligned buffer that a store's PUT also does
		stampSectors(b, off)
		if err := directio.WriteFull(c.fd, b, off); err != nil {
			return fmt.Errorf("pwrite %d bytes at %d: %w", len(b), off, err)
		}
	}
	return nil
}

func (c *odirectConn) exist(keys [][]byte, res []error) error { return errNoExist }
