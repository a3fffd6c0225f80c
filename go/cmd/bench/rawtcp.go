//go:build linux

package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/cmd/internal/cli"
)

// The raw TCP baseline protocol: the least work a request/reply store can do over TCP, the
// "wire speed" reference. A request is a 16-byte header {op u32, len u64, slot u32} (little
// endian); PUT carries len payload bytes, which the server reads into slot `slot` of its
// working set; GET asks for len bytes, which the server sends from that slot; EXIST asks
// for nothing. Every reply is a 16-byte header {status u32, len u64, pad u32} followed, for
// GET, by len bytes. No keys, no lookups: the client sends its key's index as the slot, so
// the server touches a working set as large as a real store's for the same key space
// (--working-set; slot i of n-byte values is bytes [i*n, (i+1)*n) modulo the set), never
// one cache-hot buffer.
const (
	rawHdr   = 16
	rawPut   = 1
	rawGet   = 2
	rawExist = 3

	rawOK  = 0
	rawBad = 1
)

func encodeRaw(b []byte, op uint32, n uint64) { encodeRawSlot(b, op, n, 0) }

func encodeRawSlot(b []byte, op uint32, n uint64, slot uint32) {
	binary.LittleEndian.PutUint32(b[0:4], op)
	binary.LittleEndian.PutUint64(b[4:12], n)
	binary.LittleEndian.PutUint32(b[12:16], slot)
}

func decodeRaw(b []byte) (op uint32, n uint64) {
	return binary.LittleEndian.Uint32(b[0:4]), binary.LittleEndian.Uint64(b[4:12])
}

// keySlot is the decimal index a bench key ends with (see worker.setKey).
func keySlot(k []byte) uint32 {
	var v uint32
	mult := uint32(1)
	for i := len(k) - 1; i >= 0 && k[i] >= '0' && k[i] <= '9' && mult != 0; i-- {
		v += uint32(k[i]-'0') * mult
		mult *= 10
	}
	return v
}

// region is the n bytes of slot within a working set ws (len(ws) >= n).
func region(ws []byte, slot uint32, n uint64) []byte {
	off := slotIndex(ws, slot, n) * n
	return ws[off : off+n]
}

// slotIndex is the position of slot's region in ws (slots wrap around the working set).
func slotIndex(ws []byte, slot uint32, n uint64) uint64 { return uint64(slot) % (uint64(len(ws)) / n) }

// rawServe runs `dfkv_bench rawserver`: until SIGTERM/SIGINT.
func rawServe(args []string) int {
	fs := flag.NewFlagSet("dfkv_bench rawserver", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	addrFile := fs.String("addr-file", "", "write the bound host:port here once listening")
	maxSize := cli.Size(64 << 20)
	fs.Var(&maxSize, "max-size", "largest request payload / reply served")
	ws := cli.Size(0)
	fs.Var(&ws, "working-set", "bytes the GET/PUT slots span (default --max-size); give the key space's size")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitSetup
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dfkv_bench rawserver:", err)
		return exitSetup
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o644); err == nil {
			err = os.Rename(tmp, *addrFile)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "dfkv_bench rawserver:", err)
			return exitSetup
		}
	}
	srv := newRawServer(int(maxSize), int(max(ws, maxSize)))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; ln.Close() }()
	fmt.Fprintf(os.Stderr, "dfkv_bench rawserver: listening on %s\n", ln.Addr())
	srv.serve(ln)
	return 0
}

type rawServer struct {
	src []byte // the working set: GET replies and PUT payloads use slots of it
	// slots guards the working set by slot (striped): a PUT writes its slot under the write
	// lock, a GET sends from it under the read lock, so concurrent connections never race
	// on one slot (a run uses one value size, so distinct slots never overlap).
	slots [256]sync.RWMutex
	max   int
	wg    sync.WaitGroup
	mu    sync.Mutex
	cs    map[net.Conn]struct{}
}

func newRawServer(maxSize, workingSet int) *rawServer {
	src := make([]byte, workingSet)
	for i := range src {
		src[i] = byte(i * 7)
	}
	return &rawServer{src: src, max: maxSize, cs: map[net.Conn]struct{}{}}
}

// serve accepts until ln closes, then closes every connection and waits for them.
func (s *rawServer) serve(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			break
		}
		s.mu.Lock()
		s.cs[nc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.conn(nc)
			s.mu.Lock()
			delete(s.cs, nc)
			s.mu.Unlock()
		}()
	}
	s.mu.Lock()
	for nc := range s.cs {
		nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// conn serves one connection with one goroutine, reading through a 64 KiB buffered reader and
// replying with one writev per GET (the same I/O pattern as the dfkv server, minus the work).
func (s *rawServer) conn(nc net.Conn) {
	defer nc.Close()
	bad := func(why string, a ...any) {
		fmt.Fprintf(os.Stderr, "dfkv_bench rawserver: closing %s: %s\n", nc.RemoteAddr(), fmt.Sprintf(why, a...))
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	var req, rep [rawHdr]byte
	var bufs net.Buffers
	for {
		if _, err := io.ReadFull(br, req[:]); err != nil {
			return
		}
		op, n := decodeRaw(req[:])
		if n > uint64(s.max) {
			bad("request of %d bytes (max %d)", n, s.max)
			encodeRaw(rep[:], rawBad, 0)
			_, _ = nc.Write(rep[:])
			return
		}
		slot := binary.LittleEndian.Uint32(req[12:16])
		switch op {
		case rawPut:
			if n == 0 {
				encodeRaw(rep[:], rawOK, 0)
				if _, err := nc.Write(rep[:]); err != nil {
					return
				}
				continue
			}
			// The bytes are never read back as values (rawtcp carries no stamps), only the
			// memory traffic matters; the slot lock keeps connections off each other's slot.
			mu := &s.slots[slotIndex(s.src, slot, n)%uint64(len(s.slots))]
			mu.Lock()
			_, err := io.ReadFull(br, region(s.src, slot, n))
			mu.Unlock()
			if err != nil {
				bad("reading a %d-byte put: %v", n, err)
				return
			}
			encodeRaw(rep[:], rawOK, 0)
			if _, err := nc.Write(rep[:]); err != nil {
				return
			}
		case rawGet:
			encodeRaw(rep[:], rawOK, n)
			var payload []byte
			if n > 0 {
				payload = region(s.src, slot, n)
			}
			bufs = append(bufs[:0], rep[:], payload)
			b := bufs
			var err error
			if n > 0 {
				mu := &s.slots[slotIndex(s.src, slot, n)%uint64(len(s.slots))]
				mu.RLock()
				_, err = b.WriteTo(nc)
				mu.RUnlock()
			} else {
				_, err = b.WriteTo(nc)
			}
			if err != nil {
				return
			}
		case rawExist:
			encodeRaw(rep[:], rawOK, 0)
			if _, err := nc.Write(rep[:]); err != nil {
				return
			}
		default:
			bad("unknown op %d", op)
			encodeRaw(rep[:], rawBad, 0)
			_, _ = nc.Write(rep[:])
			return
		}
	}
}

// rawConn is the client side: one TCP connection, calls of n items are pipelined (all
// requests written, then all replies read).
type rawConn struct {
	nc      net.Conn
	br      *bufio.Reader
	timeout time.Duration
	hdrs    []byte
	bufs    net.Buffers
	rep     [rawHdr]byte
}

func dialRaw(cfg targetConfig) (conn, error) {
	nc, err := net.DialTimeout("tcp", cfg.addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), timeout: cfg.ioTimeout,
		hdrs: make([]byte, rawHdr*max(1, cfg.batch))}, nil
}

func (r *rawConn) close() error { return r.nc.Close() }

func (r *rawConn) hdr(i int) []byte {
	if len(r.hdrs) < (i+1)*rawHdr {
		r.hdrs = append(r.hdrs, make([]byte, (i+1)*rawHdr-len(r.hdrs))...)
	}
	return r.hdrs[i*rawHdr : (i+1)*rawHdr]
}

// send writes n pipelined requests in one writev; sized[i] gives request i's length (nil: 0)
// and is sent as its payload when withPayload; keys[i]'s index is its slot.
func (r *rawConn) send(op uint32, keys, sized [][]byte, withPayload bool, n int) error {
	_ = r.nc.SetDeadline(time.Now().Add(r.timeout))
	r.bufs = r.bufs[:0]
	for i := 0; i < n; i++ {
		h := r.hdr(i)
		var l uint64
		if sized != nil {
			l = uint64(len(sized[i]))
		}
		encodeRawSlot(h, op, l, keySlot(keys[i]))
		r.bufs = append(r.bufs, h)
		if withPayload {
			r.bufs = append(r.bufs, sized[i])
		}
	}
	b := r.bufs
	_, err := b.WriteTo(r.nc)
	clear(r.bufs)
	return err
}

func (r *rawConn) reply() (uint64, error) {
	if _, err := io.ReadFull(r.br, r.rep[:]); err != nil {
		return 0, err
	}
	st, n := decodeRaw(r.rep[:])
	if st != rawOK {
		return 0, fmt.Errorf("rawtcp: status %d", st)
	}
	return n, nil
}

func (r *rawConn) put(keys, vals [][]byte, res []error) error {
	if err := r.send(rawPut, keys, vals, true, len(keys)); err != nil {
		return err
	}
	for i := range keys {
		if _, err := r.reply(); err != nil {
			return err
		}
		res[i] = nil
	}
	return nil
}

func (r *rawConn) get(keys, bufs [][]byte, res []error) error {
	if err := r.send(rawGet, keys, bufs, false, len(keys)); err != nil {
		return err
	}
	for i := range keys {
		n, err := r.reply()
		if err != nil {
			return err
		}
		if n != uint64(len(bufs[i])) {
			return fmt.Errorf("rawtcp: %d-byte reply for %d", n, len(bufs[i]))
		}
		if _, err := io.ReadFull(r.br, bufs[i]); err != nil {
			return err
		}
		res[i] = nil
	}
	return nil
}

func (r *rawConn) exist(keys [][]byte, res []error) error {
	if err := r.send(rawExist, keys, nil, false, len(keys)); err != nil {
		return err
	}
	for i := range keys {
		if _, err := r.reply(); err != nil {
			return err
		}
		res[i] = nil
	}
	return nil
}
