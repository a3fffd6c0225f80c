package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dfkv/dfkv/go/internal/metrics"
	"github.com/dfkv/dfkv/go/internal/version"
)

// The lifecycle pieces dfkv_server and dfkv_mds share once their service is built: where
// their data lives by default, the metrics registry and endpoint, the address file, and the
// wait for a stop signal or a failure.

// DataDir returns the default directory for sub ("data", "etcd"): $XDG_DATA_HOME/dfkv/sub,
// else ~/.local/share/dfkv/sub, else $TMPDIR/dfkv-sub.
func DataDir(sub string) string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "dfkv", sub)
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "dfkv", sub)
	}
	return filepath.Join(os.TempDir(), "dfkv-"+sub)
}

// NewRegistry returns a registry with the Go and process collectors and a build-info gauge
// (set to 1) named name, labelled version=<build version> plus the given label pairs.
func NewRegistry(name, help string, labelPairs ...string) *prometheus.Registry {
	if len(labelPairs)%2 != 0 {
		panic("cli.NewRegistry: odd label pairs") // a programming error, caught by every daemon test
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	names, values := []string{"version"}, []string{version.Version}
	for i := 0; i < len(labelPairs); i += 2 {
		names, values = append(names, labelPairs[i]), append(values, labelPairs[i+1])
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, names)
	g.WithLabelValues(values...).Set(1)
	reg.MustRegister(g)
	return reg
}

// StartMetrics serves /metrics, /healthz and /readyz on host:port; port 0 means off (nil).
func StartMetrics(host string, port int, cfg metrics.HTTPConfig) (*metrics.HTTPServer, error) {
	if port <= 0 {
		return nil, nil
	}
	cfg.Addr = net.JoinHostPort(host, strconv.Itoa(port))
	h, err := metrics.StartHTTP(cfg)
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("metrics listening", "addr", h.Addr())
	return h, nil
}

// WriteAddrFile writes addr and a newline to path atomically (temp file and rename), so a
// reader never sees a partial address. An empty path writes nothing.
func WriteAddrFile(path, addr string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return fmt.Errorf("--addr-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--addr-file: %w", err)
	}
	return nil
}

// Stop is a daemon's subscription to SIGTERM and SIGINT, taken by RunDaemon before serve
// runs. Until Ready a signal ends the process at once, as the signal's default action did
// (a long start, such as a slab rebuild, must not hold up a stop). From Ready, which a
// daemon calls just before it announces itself (the address file), a signal is kept for
// Wait: one sent the moment the address file appears (a supervisor or test that starts the
// daemon, reads the file and stops it) is a clean stop.
type Stop struct {
	sig     chan os.Signal
	kept    chan os.Signal // signals from Ready on, for Wait
	ready   atomic.Bool
	onEarly func(os.Signal) // a signal before Ready (default: exit)
	done    chan struct{}
}

// CatchStop subscribes to SIGTERM and SIGINT; Release ends the subscription.
func CatchStop(log *slog.Logger) *Stop {
	return catchStop(func(sig os.Signal) {
		log.Info("stopping during start: exiting at once", "signal", sig.String())
		os.Exit(1)
	})
}

func catchStop(onEarly func(os.Signal)) *Stop {
	s := &Stop{sig: make(chan os.Signal, 1), kept: make(chan os.Signal, 1), onEarly: onEarly, done: make(chan struct{})}
	signal.Notify(s.sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		defer close(s.done)
		for sig := range s.sig {
			if !s.ready.Load() {
				s.onEarly(sig)
				continue
			}
			select {
			case s.kept <- sig:
			default: // one kept signal is enough to stop
			}
		}
	}()
	return s
}

// Ready hands later signals to Wait instead of ending the process.
func (s *Stop) Ready() { s.ready.Store(true) }

// Release stops catching the signals.
func (s *Stop) Release() {
	signal.Stop(s.sig) // no send on s.sig after it returns
	close(s.sig)
	<-s.done
}

// Wait blocks until SIGTERM or SIGINT, caught any time since Ready (it returns nil), or
// until one of failures delivers (it returns that error, logged as what).
func (s *Stop) Wait(log *slog.Logger, failures map[string]<-chan error) error {
	// A fixed set of at most a few channels: one goroutine each forwards the first error.
	type failure struct {
		what string
		err  error
	}
	fc := make(chan failure, len(failures))
	done := make(chan struct{})
	defer close(done)
	for what, ch := range failures {
		if ch == nil {
			continue
		}
		go func() {
			select {
			case err := <-ch:
				fc <- failure{what, err}
			case <-done:
			}
		}()
	}
	select {
	case sig := <-s.kept:
		log.Info("stopping", "signal", sig.String())
		return nil
	case f := <-fc:
		log.Error(f.what+" failed", "err", f.err)
		return f.err
	}
}
