package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// logUniform picks sizes between lo and hi with a uniform log: every order of magnitude
// is covered without the run being dominated by the largest values.
func logUniform(r *rand.Rand, lo, hi int) int {
	return int(math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi))-math.Log(float64(lo)))))
}

func TestThousandValuesRoundTrip(t *testing.T) {
	s := startServer(t, t.TempDir(), "--cap", "3GiB", "--max-msg", "4MiB")
	c := newClient(t, s.addr)
	r := rand.New(rand.NewPCG(11, 12))
	const N = 1000
	sizes := make([]int, N)
	for i := range sizes {
		sizes[i] = logUniform(r, 4<<10, 4<<20)
	}
	sizes[0], sizes[1] = 4<<10, 4<<20
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= N {
					return
				}
				k := fmt.Sprintf("v-%d", i)
				if err := c.Put(context.Background(), []byte(k), value(k, 0, sizes[i])); err != nil {
					errs <- fmt.Errorf("put %s (%d bytes): %w", k, sizes[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	for i := 0; i < N; i++ {
		k := fmt.Sprintf("v-%d", i)
		n, err := c.GetAuto(context.Background(), []byte(k), buf)
		if err != nil || n != sizes[i] || !bytes.Equal(buf[:n], value(k, 0, sizes[i])) {
			t.Fatalf("get %s: n=%d want %d err=%v", k, n, sizes[i], err)
		}
	}
	if got := s.metric("dfkv_store_objects"); got != N {
		t.Fatalf("store objects = %v, want %d", got, N)
	}
	if s.httpStatus("/healthz") != 200 || s.httpStatus("/readyz") != 200 {
		t.Fatal("health endpoints not OK")
	}
	// SIGTERM drains and exits 0; a clean restart keeps everything.
	if code := s.stop(); code != 0 {
		t.Fatalf("SIGTERM exit code %d\n%s", code, s.log)
	}
	if engine() == "mem" {
		return
	}
	s.start()
	c2 := newClient(t, s.addr)
	for i := 0; i < N; i += 37 {
		k := fmt.Sprintf("v-%d", i)
		n, err := c2.GetAuto(context.Background(), []byte(k), buf)
		if err != nil || !bytes.Equal(buf[:n], value(k, 0, sizes[i])) {
			t.Fatalf("after restart, get %s: %v", k, err)
		}
	}
}

// SIGKILL in the middle of a storm of 8 concurrent writers: after a restart every key is
// NotFound or byte-exact, and every write acknowledged before the kill survives.
func TestKillDuringWriteStorm(t *testing.T) {
	if engine() == "mem" {
		t.Skip("the mem engine is not persistent")
	}
	dir := t.TempDir()
	s := startServer(t, dir, "--cap", "2GiB", "--max-msg", "4MiB")
	c := newClient(t, s.addr)
	before := preload(t, c, 100, 21)
	st := startStorm(c, 8, 99)
	deadline := time.Now().Add(10 * time.Second)
	for st.total.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	st.halt()
	if st.total.Load() == 0 {
		t.Fatal("the storm wrote nothing before the kill")
	}
	t.Logf("killed after %d acknowledged storm writes (%d attempted)", len(st.acked), len(st.attempted))

	s.start()
	lostAcked := st.verify(t, newClient(t, s.addr), before)
	if lostAcked > 0 {
		t.Fatalf("%d acknowledged storm writes lost (writes are synchronous and durable)", lostAcked)
	}
}

// Filling past --cap keeps usage under the cap, evicts, and writers see no errors.
func TestEvictionUnderCap(t *testing.T) {
	const capBytes = 96 << 20
	s := startServer(t, t.TempDir(), "--cap", fmt.Sprint(capBytes), "--extent-size", "8MiB", "--max-msg", "4MiB")
	c := newClient(t, s.addr)
	const size = 256 << 10
	n := 3 * capBytes / size
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("fill-%d", i)
		if err := c.Put(context.Background(), []byte(k), value(k, 0, size)); err != nil {
			t.Fatalf("put %d/%d past the cap: %v", i, n, err)
		}
		if i%64 == 0 {
			if used := s.metric("dfkv_store_used_bytes"); used > capBytes {
				t.Fatalf("used %v > cap %d after %d puts", used, capBytes, i)
			}
		}
	}
	if used := s.metric("dfkv_store_used_bytes"); used > capBytes || used == 0 {
		t.Fatalf("used bytes %v (cap %d)", used, capBytes)
	}
	if ev := s.metric("dfkv_store_evictions_total"); ev <= 0 {
		t.Fatalf("no evictions after writing %dx the cap", 3)
	}
	// The most recent values are still readable byte-exact.
	buf := make([]byte, size)
	k := fmt.Sprintf("fill-%d", n-1)
	if err := c.Get(context.Background(), []byte(k), buf); err != nil || !bytes.Equal(buf, value(k, 0, size)) {
		t.Fatalf("newest value: %v", err)
	}
}

func TestMalformedInputAgainstBinary(t *testing.T) {
	s := startServer(t, t.TempDir(), "--cap", "256MiB", "--max-msg", "1MiB")
	c := newClient(t, s.addr)
	r := rand.New(rand.NewPCG(31, 32))
	for i := 0; i < 50; i++ {
		nc, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		junk := make([]byte, 1+r.IntN(4096))
		for j := range junk {
			junk[j] = byte(r.Uint32())
		}
		if i%5 == 0 {
			copy(junk, "DFK1") // right magic, garbage after it
		}
		_, _ = nc.Write(junk)
		nc.Close()
	}
	if err := c.Put(context.Background(), []byte("k"), []byte("still serving")); err != nil {
		t.Fatalf("server stopped serving after garbage: %v\n%s", err, s.log)
	}
	if err := c.Put(context.Background(), []byte("big"), make([]byte, 1<<20+1)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("oversized value: %v", err)
	}
	if s.metric("dfkv_server_invalid_frames_total") == 0 {
		t.Fatal("invalid frames not counted")
	}
}

func TestDfkvctl(t *testing.T) {
	s := startServer(t, t.TempDir(), "--cap", "256MiB")
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	out := filepath.Join(dir, "out")
	data := value("ctl", 0, 300000)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := func(stdin []byte, args ...string) (string, int) {
		cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), append([]string{"--node", s.addr, "--ns", "cli"}, args...)...)
		cmd.Stdin = bytes.NewReader(stdin)
		b, _ := cmd.CombinedOutput()
		return string(b), cmd.ProcessState.ExitCode()
	}
	cases := []struct {
		args  []string
		stdin []byte
		code  int
		want  string
	}{
		{[]string{"put", "key1", in}, nil, 0, "stored 300000 bytes"},
		{[]string{"put", "key2", "-"}, []byte("from stdin"), 0, "stored 10 bytes"},
		{[]string{"get", "key1", out}, nil, 0, ""},
		{[]string{"get", "key2"}, nil, 0, "from stdin"},
		{[]string{"exist", "key1"}, nil, 0, "300000"},
		{[]string{"exist", "nope"}, nil, 1, "not found"},
		{[]string{"get", "nope"}, nil, 1, "not found"},
		{[]string{"rm", "key2"}, nil, 0, "removed"},
		{[]string{"rm", "key2"}, nil, 1, "not found"},
		{[]string{"stat"}, nil, 0, "store_objects"},
		{[]string{"frobnicate"}, nil, 2, "unknown command"},
		{[]string{"put", "k"}, nil, 2, "takes"},
		{[]string{"put", "k", filepath.Join(dir, "missing")}, nil, 2, "no such file"},
	}
	for _, c := range cases {
		got, code := ctl(c.stdin, c.args...)
		if code != c.code || !strings.Contains(got, c.want) {
			t.Errorf("dfkvctl %v: exit %d output %q; want exit %d containing %q", c.args, code, got, c.code, c.want)
		}
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("dfkvctl get wrote wrong bytes: %v", err)
	}
	// Unreachable node is an error (2), not a miss.
	cmd := exec.Command(filepath.Join(binDir, "dfkvctl"), "--node", "127.0.0.1:1", "--timeout", "500ms", "exist", "k")
	_ = cmd.Run()
	if cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("unreachable node exit %d, want 2", cmd.ProcessState.ExitCode())
	}
}

func TestBadConfigurationRefusesToStart(t *testing.T) {
	cases := [][]string{
		{"--store-engine", "bogus"},
		{"--cap", "0"},
		{"--max-msg", "0"},
		{"--cap", "1MiB"},
	}
	for _, extra := range cases {
		dir := t.TempDir()
		args := append([]string{"--host", "127.0.0.1", "--port", "0", "--dir", filepath.Join(dir, "data"), "--store-engine", engine()}, extra...)
		cmd := exec.Command(filepath.Join(binDir, "dfkv_server"), args...)
		done := make(chan error, 1)
		var outb bytes.Buffer
		cmd.Stderr = &outb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
			if cmd.ProcessState.ExitCode() == 0 {
				t.Errorf("%v: exit 0", extra)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			if extra[0] != "--cap" || engine() != "mem" { // mem accepts a tiny cap
				t.Errorf("%v: server started with a bad configuration", extra)
			}
		}
	}
}
