//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/directio"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

func TestExactPercentile(t *testing.T) {
	s := make([]int64, 100)
	for i := range s {
		s[i] = int64(i + 1)
	}
	for _, c := range []struct {
		p    float64
		want int64
	}{{0.5, 50}, {0.9, 90}, {0.99, 99}, {0.999, 100}, {1, 100}, {0.001, 1}, {0, 1}} {
		if got := exactPercentile(s, c.p); got != c.want {
			t.Errorf("p%v = %d, want %d", c.p, got, c.want)
		}
	}
	if exactPercentile(nil, 0.5) != 0 {
		t.Error("empty: want 0")
	}
	if got := exactPercentile([]int64{7}, 0.999); got != 7 {
		t.Errorf("single sample: %d", got)
	}
}

func TestBucketsCoverEveryValue(t *testing.T) {
	vals := []int64{0, 1, 127, 128, 129, 255, 256, 1000, 4095, 4096, 1e6, 123456789, 1 << 40, 1<<62 + 12345}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		vals = append(vals, r.Int64N(1<<(1+r.IntN(60))))
	}
	for _, v := range vals {
		b := bucketOf(v)
		if b < 0 || b >= histBuckets {
			t.Fatalf("bucketOf(%d) = %d out of range", v, b)
		}
		hi := bucketHigh(b)
		if hi < v {
			t.Fatalf("bucketHigh(bucketOf(%d)) = %d < v", v, hi)
		}
		if b > 0 && bucketHigh(b-1) >= v {
			t.Fatalf("v=%d: previous bucket's high %d already covers it", v, bucketHigh(b-1))
		}
		if v >= subBuckets && float64(hi-v) > float64(v)/subBuckets {
			t.Fatalf("v=%d: bucket high %d off by more than 1/%d", v, hi, subBuckets)
		}
	}
	if bucketOf(-5) != 0 {
		t.Error("negative values must land in bucket 0")
	}
}

func TestHistogramPercentilesMatchExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var h, a, b hist
	var samples []int64
	for i := range 50000 {
		// Two modes plus a tail, like small-op latency on this VM.
		v := int64(20000 + r.IntN(5000))
		switch {
		case i%7 == 0:
			v = int64(80000 + r.IntN(20000))
		case i%1000 == 0:
			v = int64(5e6 + r.IntN(1e6))
		}
		samples = append(samples, v)
		h.record(time.Duration(v))
		if i%2 == 0 {
			a.record(time.Duration(v))
		} else {
			b.record(time.Duration(v))
		}
	}
	a.merge(&b)
	slices.Sort(samples)
	for _, p := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		want := exactPercentile(samples, p)
		for name, hh := range map[string]*hist{"single": &h, "merged": &a} {
			got := hh.percentile(p)
			if got < want || float64(got-want) > float64(want)/subBuckets {
				t.Errorf("%s p%v = %d, exact %d", name, p, got, want)
			}
		}
	}
	if h.percentile(1) != samples[len(samples)-1] || h.max != samples[len(samples)-1] {
		t.Errorf("max: %d / %d, want %d", h.percentile(1), h.max, samples[len(samples)-1])
	}
	if h.min != samples[0] || a.min != samples[0] || a.n != h.n {
		t.Errorf("min/n: %d %d %d/%d", h.min, a.min, a.n, h.n)
	}
	var empty hist
	if empty.percentile(0.5) != 0 || empty.mean() != 0 {
		t.Error("empty histogram must report 0")
	}
}

func br(s string) *bufio.Reader { return bufio.NewReaderSize(strings.NewReader(s), 64) }

func TestRESPReplies(t *testing.T) {
	// One pipelined stream: every reply kind, in order.
	in := br("+OK\r\n$5\r\nhello\r\n$-1\r\n:1\r\n:0\r\n-ERR wrong type\r\n$0\r\n\r\n$11\r\nhello world\r\n+OK\r\n")
	buf := make([]byte, 5)
	kind, n, err := respReply(in, buf)
	if kind != '+' || err != nil {
		t.Fatalf("+OK: %q %d %v", kind, n, err)
	}
	if kind, n, err = respReply(in, buf); kind != '$' || n != 5 || err != nil || string(buf) != "hello" {
		t.Fatalf("bulk: %q %d %v %q", kind, n, err, buf)
	}
	if kind, n, err = respReply(in, buf); kind != '$' || n != -1 || err != nil {
		t.Fatalf("nil bulk: %q %d %v", kind, n, err)
	}
	if kind, n, err = respReply(in, nil); kind != ':' || n != 1 || err != nil {
		t.Fatalf("int: %q %d %v", kind, n, err)
	}
	if kind, n, err = respReply(in, nil); kind != ':' || n != 0 || err != nil {
		t.Fatalf("int 0: %q %d %v", kind, n, err)
	}
	kind, _, err = respReply(in, nil)
	var re replyError
	if kind != '-' || !errors.As(err, &re) || err.Error() != "redis: ERR wrong type" || !recoverable(err) {
		t.Fatalf("error reply: %q %v", kind, err)
	}
	if kind, n, err = respReply(in, buf); kind != '$' || n != 0 || err != nil {
		t.Fatalf("empty bulk: %q %d %v", kind, n, err)
	}
	// Too long for the buffer: consumed, reported, stream intact.
	if _, n, err = respReply(in, buf); n != 11 || !recoverable(err) || err == nil {
		t.Fatalf("oversized bulk: %d %v", n, err)
	}
	if kind, _, err = respReply(in, nil); kind != '+' || err != nil {
		t.Fatalf("after oversized bulk: %q %v", kind, err)
	}
	if _, _, err = respReply(in, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}

	for _, bad := range []string{"$5\r\nhel", "$5\r\nhelloXY", "$x\r\n", "*1\r\n", "\r\n", ":12\n", "$-2\r\n", ":99999999999999999999\r\n"} {
		_, _, err := respReply(br(bad), make([]byte, 8))
		if err == nil || recoverable(err) {
			t.Errorf("%q: want a fatal error, got %v", bad, err)
		}
	}
}

func TestRESPCommandBytes(t *testing.T) {
	got := appendCommand(nil, cmdGET, []byte("bench:0000000042"))
	want := "*2\r\n$3\r\nGET\r\n$16\r\nbench:0000000042\r\n"
	if string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}
	got = appendCommand(got[:0], cmdEXISTS, []byte(""))
	if string(got) != "*2\r\n$6\r\nEXISTS\r\n$0\r\n\r\n" {
		t.Fatalf("got %q", got)
	}
}

// redisFake answers a pipelined SET/GET over a pipe, checking the exact request bytes.
func TestRedisConnPipelined(t *testing.T) {
	cli, srv := net.Pipe()
	defer cli.Close()
	rc := &redisConn{nc: cli, br: bufio.NewReader(cli), timeout: 5 * time.Second}
	keys := [][]byte{[]byte("k:1"), []byte("k:2")}
	vals := [][]byte{[]byte("aa"), []byte("bbb")}
	go func() {
		defer srv.Close()
		want := "*3\r\n$3\r\nSET\r\n$3\r\nk:1\r\n$2\r\naa\r\n*3\r\n$3\r\nSET\r\n$3\r\nk:2\r\n$3\r\nbbb\r\n"
		got := make([]byte, len(want))
		if _, err := io.ReadFull(srv, got); err != nil || string(got) != want {
			t.Errorf("SET bytes %q (%v)", got, err)
			return
		}
		srv.Write([]byte("+OK\r\n-OOM command not allowed\r\n"))
		want = "*2\r\n$3\r\nGET\r\n$3\r\nk:1\r\n*2\r\n$3\r\nGET\r\n$3\r\nk:2\r\n"
		got = make([]byte, len(want))
		if _, err := io.ReadFull(srv, got); err != nil || string(got) != want {
			t.Errorf("GET bytes %q (%v)", got, err)
			return
		}
		srv.Write([]byte("$2\r\naa\r\n$-1\r\n"))
	}()
	res := make([]error, 2)
	if err := rc.put(keys, vals, res); err != nil || res[0] != nil || res[1] == nil || !strings.Contains(res[1].Error(), "OOM") {
		t.Fatalf("put: %v %v", err, res)
	}
	bufs := [][]byte{make([]byte, 2), make([]byte, 3)}
	if err := rc.get(keys, bufs, res); err != nil || res[0] != nil || !errors.Is(res[1], errMiss) || string(bufs[0]) != "aa" {
		t.Fatalf("get: %v %v %q", err, res, bufs[0])
	}
}

func TestMemcachedReplies(t *testing.T) {
	key := []byte("bench:0000000007")
	buf := make([]byte, 5)
	in := br("VALUE bench:0000000007 0 5\r\nhello\r\nEND\r\n" +
		"END\r\n" +
		"VALUE bench:0000000007 0 3 99\r\nabc\r\nEND\r\n" + // wrong size: item fails, stream intact
		"SERVER_ERROR object too large for cache\r\n" +
		"VALUE bench:0000000007 12 5\r\nworld\r\nEND\r\n")
	if err := mcGetReply(in, key, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("hit: %v %q", err, buf)
	}
	if err := mcGetReply(in, key, buf); !errors.Is(err, errMiss) {
		t.Fatalf("miss: %v", err)
	}
	if err := mcGetReply(in, key, buf); err == nil || !recoverable(err) {
		t.Fatalf("wrong size: %v", err)
	}
	if err := mcGetReply(in, key, buf); err == nil || !recoverable(err) || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("server error: %v", err)
	}
	if err := mcGetReply(in, key, buf); err != nil || string(buf) != "world" {
		t.Fatalf("after errors: %v %q", err, buf)
	}
	for _, bad := range []string{
		"VALUE other 0 5\r\nhello\r\nEND\r\n",              // another key
		"VALUE bench:0000000007 0 5\r\nhelloEND\r\n",       // data not CRLF-terminated
		"VALUE bench:0000000007 0 5\r\nhello\r\nEN\r\n",    // no END
		"VALUE bench:0000000007 0 x\r\n",                   // bad length
		"ERROR\r\n", "CLIENT_ERROR bad data chunk\r\n", "", // unknown command, client error, EOF
	} {
		if err := mcGetReply(br(bad), key, buf); err == nil || recoverable(err) {
			t.Errorf("%q: want a fatal error, got %v", bad, err)
		}
	}

	st := br("STORED\r\nNOT_STORED\r\nSERVER_ERROR out of memory storing object\r\nEXISTS\r\n")
	if err := mcStoreReply(st); err != nil {
		t.Fatalf("STORED: %v", err)
	}
	if err := mcStoreReply(st); err == nil || !recoverable(err) {
		t.Fatalf("NOT_STORED: %v", err)
	}
	if err := mcStoreReply(st); err == nil || !recoverable(err) {
		t.Fatalf("SERVER_ERROR: %v", err)
	}
	if err := mcStoreReply(st); err == nil || recoverable(err) {
		t.Fatalf("unexpected line: %v", err)
	}

	mg := br("HD\r\nEN\r\nOK\r\nVA 2\r\n")
	if err := mcMetaReply(mg); err != nil {
		t.Fatalf("HD: %v", err)
	}
	if err := mcMetaReply(mg); !errors.Is(err, errMiss) {
		t.Fatalf("EN: %v", err)
	}
	if err := mcMetaReply(mg); err != nil {
		t.Fatalf("OK: %v", err)
	}
	if err := mcMetaReply(mg); err == nil || recoverable(err) {
		t.Fatalf("VA: %v", err)
	}
}

func TestKeysSizesAndRawHeader(t *testing.T) {
	o := &options{ns: "ns", batch: 2, size: 16, op: "get"}
	w := newWorker(o, nil, 1)
	w.setKey(1, 1234567)
	if string(w.keys[1]) != "ns:0001234567" || w.idx[1] != 1234567 {
		t.Fatalf("key %q idx %d", w.keys[1], w.idx[1])
	}
	v := make([]byte, 16)
	stamp(v, 99)
	if !stamped(v, 99) || stamped(v, 98) || !stamped([]byte{1}, 5) {
		t.Fatal("stamp")
	}
	for n, want := range map[int64]string{1 << 20: "1MiB", 4096: "4KiB", 3 << 30: "3GiB", 1000: "1000B", 1536: "1536B"} {
		if got := sizeLabel(n); got != want {
			t.Errorf("sizeLabel(%d) = %q, want %q", n, got, want)
		}
	}
	var h [rawHdr]byte
	encodeRaw(h[:], rawGet, 1<<40+5)
	if op, n := decodeRaw(h[:]); op != rawGet || n != 1<<40+5 {
		t.Fatalf("raw header: %d %d", op, n)
	}
	if p, err := parseInt([]byte("-42")); p != -42 || err != nil {
		t.Fatalf("parseInt: %d %v", p, err)
	}
}

func TestFlagErrorsAreSetupErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--op", "nope"}, {"--size", "0"}, {"--conns", "0"}, {"--bogus"}, {"--target", "x", "--addr", "127.0.0.1:1"},
		{"--node", "127.0.0.1:1", "--transport", "udp", "--count", "1"},
		{"--target", "rawtcp", "--count", "1"},                          // no --addr
		{"--target", "rawtcp", "--addr", "127.0.0.1:1", "--count", "1"}, // nothing listening
	} {
		var out, errb bytes.Buffer
		if code := benchMain(args, &out, &errb); code != exitSetup {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitSetup, errb.String())
		}
	}
}

func runJSON(t *testing.T, args ...string) (result, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := benchMain(append([]string{"--json", "--warmup", "0"}, args...), &out, &errb)
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: exit %d, no JSON: %v\nstdout %s\nstderr %s", args, code, err, out.String(), errb.String())
	}
	return r, code
}

// The raw server keeps a working set: a key's index picks its slot, PUT writes that slot and
// GET reads it back, and slots wrap modulo the set (so the set, not one buffer, is touched).
func TestRawTCPWorkingSet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 10
	s := newRawServer(n, 4*n)
	done := make(chan struct{})
	go func() { s.serve(ln); close(done) }()
	defer func() { ln.Close(); <-done }()
	c, err := dialRaw(targetConfig{addr: ln.Addr().String(), ioTimeout: 5 * time.Second, batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	res := make([]error, 2)
	keys := [][]byte{[]byte("k-000002"), []byte("k-000003")}
	vals := [][]byte{bytes.Repeat([]byte{0xA2}, n), bytes.Repeat([]byte{0xB3}, n)}
	if err := c.put(keys, vals, res); err != nil || res[0] != nil || res[1] != nil {
		t.Fatal(err, res)
	}
	// Slot 6 is slot 2 again (4 slots); slot 3 holds its own bytes.
	bufs := [][]byte{make([]byte, n), make([]byte, n)}
	if err := c.get([][]byte{[]byte("k-000006"), []byte("k-000003")}, bufs, res); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bufs[0], vals[0]) || !bytes.Equal(bufs[1], vals[1]) {
		t.Fatalf("slots not kept: %x.. %x..", bufs[0][:4], bufs[1][:4])
	}
	if got := keySlot([]byte("cmp-0012345")); got != 12345 {
		t.Fatalf("keySlot = %d", got)
	}
}

func TestRawTCPEndToEnd(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newRawServer(1<<20, 4<<20)
	done := make(chan struct{})
	go func() { s.serve(ln); close(done) }()
	defer func() { ln.Close(); <-done }()
	addr := ln.Addr().String()
	for _, op := range []string{"get", "put", "exist"} {
		r, code := runJSON(t, "--target", "rawtcp", "--addr", addr, "--op", op, "--size", "64KiB",
			"--conns", "2", "--batch", "3", "--count", "100")
		if code != exitOK || r.Items != 100 || r.Errors != 0 || r.Latency.P50 <= 0 {
			t.Errorf("%s: exit %d %+v", op, code, r)
		}
		if op != "exist" && r.Bytes != 100*64<<10 {
			t.Errorf("%s: %d bytes moved", op, r.Bytes)
		}
	}
}

func TestDfkvEndToEnd(t *testing.T) {
	mem := store.NewMem(64 << 20)
	srv, err := server.New(server.Config{Engine: mem})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	addr := ln.Addr().String()
	// Misses before seeding: exit 0 normally, 1 with --strict.
	r, code := runJSON(t, "--node", addr, "--op", "get", "--size", "4KiB", "--keys", "50", "--count", "20")
	if code != exitOK || r.Misses != 20 || r.Errors != 0 {
		t.Fatalf("unseeded get: exit %d %+v", code, r)
	}
	if _, code = runJSON(t, "--node", addr, "--op", "exist", "--keys", "50", "--count", "5", "--strict"); code != exitFail {
		t.Fatalf("strict misses: exit %d", code)
	}
	for _, batch := range []string{"1", "8"} {
		r, code = runJSON(t, "--members", "n1="+addr, "--op", "get", "--size", "4KiB", "--keys", "50", "--seed",
			"--count", "200", "--batch", batch, "--conns", "3", "--strict")
		if code != exitOK || r.Items != 200 || r.Bytes != 200*4096 || r.Misses != 0 {
			t.Fatalf("seeded get batch %s: exit %d %+v", batch, code, r)
		}
		r, code = runJSON(t, "--node", addr, "--op", "mixed", "--size", "4KiB", "--keys", "50",
			"--count", "200", "--batch", batch, "--strict")
		if code != exitOK || r.Items != 200 || r.Errors != 0 {
			t.Fatalf("mixed batch %s: exit %d %+v", batch, code, r)
		}
		r, code = runJSON(t, "--node", addr, "--op", "exist", "--keys", "50", "--count", "100", "--batch", batch, "--strict")
		if code != exitOK || r.Items != 100 || r.Misses != 0 {
			t.Fatalf("exist batch %s: exit %d %+v", batch, code, r)
		}
	}
	// Values of another size under the same keys: exact-size GETs fail (exit 1).
	r, code = runJSON(t, "--node", addr, "--op", "get", "--size", "8KiB", "--keys", "50", "--count", "10")
	if code != exitFail || r.Errors == 0 {
		t.Fatalf("wrong-size get: exit %d %+v", code, r)
	}
	// --distinct: every PUT a new key from --key-base on, none overwritten (--keys 10 would
	// allow at most 10 new objects; warm-up PUTs before the measured 300 add a few more).
	before := mem.Stats().Objects
	r, code = runJSON(t, "--node", addr, "--op", "put", "--size", "1KiB", "--distinct", "--key-base", "5000",
		"--keys", "10", "--count", "300", "--conns", "3")
	if code != exitOK || r.Items != 300 || mem.Stats().Objects-before < 300 {
		t.Fatalf("distinct puts: exit %d, %d new objects, %+v", code, mem.Stats().Objects-before, r)
	}
	var out, errb bytes.Buffer
	if code := benchMain([]string{"--node", addr, "--op", "get", "--distinct", "--count", "1"}, &out, &errb); code != exitSetup {
		t.Fatalf("--distinct get: exit %d", code)
	}
	// Duration-bounded run stops by itself.
	start := time.Now()
	r, code = runJSON(t, "--node", addr, "--op", "put", "--size", "1KiB", "--keys", "10", "--duration", "200ms")
	if code != exitOK || r.Items == 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("duration run: exit %d %+v after %v", code, r, time.Since(start))
	}
}

func TestODirectEndToEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raw")
	// Only a file system without O_DIRECT (open fails with EINVAL, e.g. some tmpfs) is a
	// reason to skip; any other failure of odirect-prep fails the test.
	fd, err := directio.Open(path+".probe", unix.O_CREAT, 0o600)
	if errors.Is(err, unix.EINVAL) {
		t.Skipf("O_DIRECT unsupported on the temp directory's file system: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	var errb bytes.Buffer
	if code := odirectPrep([]string{"--file", path, "--bytes", "1MiB"}, &errb); code != exitOK {
		t.Fatalf("odirect-prep: exit %d: %s", code, errb.String())
	}
	for _, op := range []string{"get", "put", "mixed", "get"} {
		r, code := runJSON(t, "--target", "odirect", "--file", path, "--op", op, "--size", "100KiB",
			"--keys", "50", "--conns", "3", "--batch", "2", "--count", "60")
		if code != exitOK || r.Items != 60 || r.Errors != 0 {
			t.Fatalf("%s: exit %d %+v", op, code, r)
		}
		if op != "mixed" && r.Bytes != 60*100<<10 {
			t.Errorf("%s: %d bytes moved", op, r.Bytes)
		}
	}
	// A sector that does not carry its stamp (a misplaced read) is an error.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{9, 9, 9, 9, 9, 9, 9, 9}, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if r, code := runJSON(t, "--target", "odirect", "--file", path, "--op", "get", "--size", "1MiB",
		"--keys", "1", "--count", "1"); code != exitFail || r.Errors != 1 {
		t.Fatalf("bad stamp: exit %d %+v", code, r)
	}
	for _, args := range [][]string{
		{"--target", "odirect", "--count", "1"},                                   // no --file
		{"--target", "odirect", "--file", path, "--size", "2MiB", "--count", "1"}, // file smaller than a block
		{"--target", "odirect", "--file", path, "--op", "exist", "--count", "1"},
	} {
		if code := benchMain(args, io.Discard, io.Discard); code != exitSetup {
			t.Errorf("%v: exit %d, want %d", args, code, exitSetup)
		}
	}
}
