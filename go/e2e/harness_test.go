package e2e

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if addr := os.Getenv(rdmaChildEnv); addr != "" {
		return rdmaChild(addr) // this process is a client a test will SIGKILL
	}
	binDir = os.Getenv("DFKV_BIN_DIR")
	if binDir == "" {
		dir, err := os.MkdirTemp("", "dfkv-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for pkg, bin := range map[string]string{"server": "dfkv_server", "dfkvctl": "dfkvctl", "mds": "dfkv_mds"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, bin), "./go/cmd/"+pkg)
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
				return 1
			}
		}
		binDir = dir
	}
	return m.Run()
}

// engine is the storage engine the e2e tests run (DFKV_E2E_ENGINE, default slab).
func engine() string {
	if e := os.Getenv("DFKV_E2E_ENGINE"); e != "" {
		return e
	}
	return "slab"
}

type serverProc struct {
	t           *testing.T
	cmd         *exec.Cmd
	dir         string
	args        []string
	addr        string
	metricsAddr string
	exited      chan error
	log         *lockedWriter
}

// startServer runs dfkv_server on dir with extra flags and waits until it listens.
func startServer(t *testing.T, dir string, extra ...string) *serverProc {
	t.Helper()
	s := &serverProc{t: t, dir: dir, args: extra}
	s.start()
	t.Cleanup(func() { s.kill() })
	return s
}

func (s *serverProc) start() {
	t := s.t
	t.Helper()
	addrFile := filepath.Join(s.dir, "addr")
	os.Remove(addrFile)
	mport := freePort(t)
	args := append([]string{"--host", "127.0.0.1", "--port", "0", "--addr-file", addrFile, "--dir", filepath.Join(s.dir, "data"),
		"--store-engine", engine(), "--metrics-port", strconv.Itoa(mport), "--log-level", "warn"}, s.args...)
	s.cmd = exec.Command(filepath.Join(binDir, "dfkv_server"), args...)
	s.log = &lockedWriter{w: &strings.Builder{}}
	s.cmd.Stderr = s.log
	s.cmd.Stdout = s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(s.cmd, s.exited)
	// A server registering a large receive segment on Soft-RoCE under emulation takes long.
	deadline := time.Now().Add(fabricTimeout(30 * time.Second))
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			s.addr = strings.TrimSpace(string(b))
			break
		}
		select {
		case err := <-s.exited:
			t.Fatalf("dfkv_server exited at start: %v\n%s", err, s.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dfkv_server did not start\n%s", s.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.metricsAddr = fmt.Sprintf("127.0.0.1:%d", mport)
}

func (s *serverProc) kill() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
		s.cmd.ProcessState = &os.ProcessState{}
	}
}

// stop sends SIGTERM and returns the exit code.
func (s *serverProc) stop() int {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.t.Fatal("dfkv_server did not exit after SIGTERM")
	}
	code := s.cmd.ProcessState.ExitCode()
	return code
}

// metric scrapes one unlabeled-or-labeled sample value by name prefix match.
func (s *serverProc) metric(name string) float64 {
	s.t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	total, found := 0.0, false
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			total += v
			found = true
		}
	}
	if !found {
		s.t.Fatalf("metric %s not exported", name)
	}
	return total
}

func (s *serverProc) httpStatus(path string) int {
	resp, err := http.Get("http://" + s.metricsAddr + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func newClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: addr, Weight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("e2e"), IOTimeout: 20 * time.Second, Cooldown: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func freePort(t *testing.T) int {
	t.Helper()
	// Below the kernel's ephemeral range: a port picked there can be taken, between this
	// check and the daemon's bind, by any outgoing connection of the tests running beside
	// this one (it happened: "bind: address already in use").
	lo, hi := 20000, ephemeralLow()
	if hi-lo < 1000 {
		lo, hi = 20000, 32768
	}
	for i := 0; i < 100; i++ {
		p := lo + rand.IntN(hi-lo)
		if l, err := listenTCP(p); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}

// value derives a deterministic payload from a key and version, so a reader can tell any
// byte that is not exactly what was written.
func value(key string, version, size int) []byte {
	r := rand.New(rand.NewPCG(uint64(len(key))*7919+uint64(version), hash(key)))
	b := make([]byte, size)
	for i := 0; i+8 <= size; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := size &^ 7; i < size; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func hash(s string) uint64 {
	h := uint64(1469598103934665603)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// ephemeralLow is the first port of the kernel's ephemeral (outgoing) range; 32768 when
// unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
