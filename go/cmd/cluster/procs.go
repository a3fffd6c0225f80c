//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process. Children get SIGKILL when the harness dies (Pdeathsig), so
// an interrupted run leaves nothing behind.
type proc struct {
	name    string
	bin     string
	args    []string
	env     []string
	logPath string
	cred    *syscall.Credential // run as this user (nil: as the harness)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd = cmd
	ch := make(chan struct{})
	p.exited = ch
	go func() { _ = cmd.Wait(); logf.Close(); close(ch) }()
	return nil
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig and waits (bounded) for the exit.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not exit within %v of %v", p.name, wait, sig)
	}
}

// cpu returns the process's user+system CPU time from /proc.
func (p *proc) cpu() time.Duration {
	pid := p.pid()
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are the 12th and 13th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / 100 // USER_HZ
}

// freePorts reserves n distinct loopback ports (closed again before use: a small race a
// harness can live with; a failed bind fails the start).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

var httpc = &http.Client{Timeout: 2 * time.Second}

func httpStatus(url string) int {
	resp, err := httpc.Get(url)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitUntil polls cond every step until it holds, ctx ends or bound passes.
func waitUntil(ctx context.Context, bound, step time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", bound, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(step):
		}
	}
	return nil
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)

// scrape sums the samples of the named families on a Prometheus text endpoint.
func scrape(url string, names ...string) (map[string]float64, error) {
	resp, err := httpc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := sampleRE.FindStringSubmatch(sc.Text()); m != nil && want[m[1]] {
			v, _ := strconv.ParseFloat(m[3], 64)
			out[m[1]] += v
		}
	}
	return out, sc.Err()
}

func logPath(dir, name string) string { return filepath.Join(dir, name+".log") }
