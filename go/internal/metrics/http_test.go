package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "dfkv_test_events_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var notReady error = errors.New("disk 2 offline")
	h, err := StartHTTP(HTTPConfig{Addr: "127.0.0.1:0", Gatherer: reg, Ready: func() error { return notReady },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	base := "http://" + h.Addr()
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "dfkv_test_events_total 3") {
		t.Fatalf("/metrics: %d %q", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "disk 2 offline") {
		t.Fatalf("/readyz while not ready: %d %q", code, body)
	}
	notReady = nil
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz when ready: %d", code)
	}
}

// Connections beyond MaxConns are closed at once; a held one is released on close.
func TestConnectionCap(t *testing.T) {
	h, err := StartHTTP(HTTPConfig{Addr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry(), MaxConns: 1,
		FirstRequestLimit: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	held, err := net.Dial("tcp", h.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// The second connection is accepted by the kernel and closed by the server: its first
	// read ends with EOF (or a reset), not a response.
	extra, err := net.Dial("tcp", h.Addr())
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = extra.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection beyond the cap: %v, want it closed", err)
	}
	extra.Close()
	held.Close()
	// The slot comes back: a request succeeds (retried until the server saw the close).
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := &http.Client{Timeout: time.Second}
		resp, err := c.Get("http://" + h.Addr() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held connection's slot never came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestListenError(t *testing.T) {
	if _, err := StartHTTP(HTTPConfig{Addr: "127.0.0.1:notaport", Gatherer: prometheus.NewRegistry()}); err == nil {
		t.Fatal("StartHTTP accepted a bad address")
	}
}
