package cli

import (
	"github.com/dfkv/dfkv/go/internal/metrics"

	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestDataDir(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", "/xdg")
	if got := DataDir("etcd"); got != "/xdg/dfkv/etcd" {
		t.Fatalf("with XDG_DATA_HOME: %s", got)
	}
	t.Setenv("XDG_DATA_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got := DataDir("data"); got != "/home/u/.local/share/dfkv/data" {
		t.Fatalf("with HOME: %s", got)
	}
}

func TestNewRegistryBuildInfo(t *testing.T) {
	reg := NewRegistry("dfkv_test_build_info", "test", "engine", "slab")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "dfkv_test_build_info" {
			continue
		}
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["engine"] != "slab" || labels["version"] == "" || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("build info %v", labels)
		}
		return
	}
	t.Fatal("no build info family")
}

func TestWriteAddrFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "addr")
	if err := WriteAddrFile(p, "127.0.0.1:1234"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "127.0.0.1:1234\n" {
		t.Fatalf("addr file %q", b)
	}
	if _, err := os.Stat(p + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("temp file left behind")
	}
	if err := WriteAddrFile(filepath.Join(t.TempDir(), "missing", "addr"), "x"); err == nil || !strings.Contains(err.Error(), "--addr-file") {
		t.Fatalf("unwritable path: %v", err)
	}
	if err := WriteAddrFile("", "x"); err != nil {
		t.Fatalf("empty path: %v", err)
	}
}

func TestStartMetricsOff(t *testing.T) {
	h, err := StartMetrics("127.0.0.1", 0, metrics.HTTPConfig{Gatherer: NewRegistry("dfkv_x_build_info", "x"), Logger: quiet})
	if err != nil || h != nil {
		t.Fatalf("port 0: %v, %v", h, err)
	}
}

func TestStopWait(t *testing.T) {
	noEarly := func(sig os.Signal) { t.Errorf("signal %v handled as one during start", sig) }
	boom := errors.New("listener died")
	ch := make(chan error, 1)
	ch <- boom
	stop := catchStop(noEarly)
	stop.Ready()
	if err := stop.Wait(quiet, map[string]<-chan error{"listener": ch, "unused": nil}); err != boom {
		t.Fatalf("failure: %v", err)
	}
	stop.Release()

	// A signal sent after Ready but before Wait (the daemon has just written its address
	// file) is kept and ends the wait with nil. Before the subscription moved ahead of
	// serve, this signal killed the process.
	stop = catchStop(noEarly)
	defer stop.Release()
	stop.Ready()
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- stop.Wait(quiet, map[string]<-chan error{"listener": make(chan error)}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("signal: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait ignored the SIGINT caught before it")
	}
}

// Before Ready (a long start) a signal goes to the early handler, which in a daemon exits
// at once; Wait never sees it.
func TestStopSignalDuringStart(t *testing.T) {
	early := make(chan os.Signal, 1)
	stop := catchStop(func(sig os.Signal) { early <- sig })
	defer stop.Release()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case sig := <-early:
		if sig != syscall.SIGTERM {
			t.Fatalf("early handler got %v", sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a signal during start reached no handler")
	}
	stop.Ready()
	if len(stop.kept) != 0 {
		t.Fatal("a signal from before Ready was kept for Wait")
	}
}
