package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The README's first command, build/dfkv_server with no flags, must start clean: no WARN or
// ERROR line on a fresh default start. Only --port 0 and --addr-file are added so that the
// test can run beside others; the data directory is the default one under a fresh
// XDG_DATA_HOME.
func TestDefaultsStartClean(t *testing.T) {
	home := t.TempDir()
	addrFile := filepath.Join(home, "addr")
	cmd := exec.Command(filepath.Join(binDir, "dfkv_server"), "--port", "0", "--addr-file", addrFile)
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+home, "HOME="+home)
	for _, kv := range os.Environ() { // no DFKV_* setting of the caller may leak in
		if strings.HasPrefix(kv, "DFKV_") {
			cmd.Env = append(cmd.Env, strings.SplitN(kv, "=", 2)[0]+"=")
		}
	}
	log := &lockedWriter{w: &strings.Builder{}}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("dfkv_server exited at start: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("dfkv_server did not start\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, log)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("dfkv_server did not stop on SIGTERM")
	}
	out := log.String()
	if !strings.Contains(out, "dfkv_server listening") || !strings.Contains(out, filepath.Join(home, "dfkv", "data")) {
		t.Fatalf("did not start on the default data directory:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a default start logged: %s", line)
		}
	}
}
