package mds

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Prober checks etcd in the background and caches a debounced answer for /readyz, so a
// readiness scrape never waits on etcd: the state turns "down" only after FailAfter
// consecutive failed probes and "up" again after one success.
type Prober struct {
	store     Store
	interval  time.Duration
	timeout   time.Duration
	failAfter int
	metrics   *Metrics

	mu       sync.Mutex
	up       bool
	fails    int
	lastErr  error
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// NewProber probes store every interval (each probe bounded by timeout).
func NewProber(store Store, interval, timeout time.Duration, failAfter int, m *Metrics) *Prober {
	if failAfter < 1 {
		failAfter = 1
	}
	return &Prober{store: store, interval: interval, timeout: timeout, failAfter: failAfter, metrics: m,
		lastErr: errors.New("etcd not probed yet"), stop: make(chan struct{}), done: make(chan struct{})}
}

// Start probes once synchronously, then in the background.
func (p *Prober) Start() {
	p.probe()
	go func() {
		defer close(p.done)
		t := time.NewTicker(p.interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.probe()
			}
		}
	}()
}

func (p *Prober) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	err := p.store.Ping(ctx)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.up, p.fails, p.lastErr = true, 0, nil
	} else {
		p.fails++
		p.lastErr = err
		if p.fails >= p.failAfter {
			p.up = false
		}
	}
	if p.metrics != nil {
		res := "ok"
		if err != nil {
			res = "error"
		}
		p.metrics.EtcdProbes.WithLabelValues(res).Inc()
		if p.up {
			p.metrics.EtcdUp.Set(1)
		} else {
			p.metrics.EtcdUp.Set(0)
		}
	}
}

// Ready is the /readyz probe: nil while etcd is (debounced) reachable.
func (p *Prober) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up {
		return nil
	}
	return p.lastErr
}

// Stop ends the background probing.
func (p *Prober) Stop() {
	p.stopOnce.Do(func() {
		close(p.stop)
		<-p.done
	})
}
