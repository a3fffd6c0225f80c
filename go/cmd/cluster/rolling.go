//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dfkv/dfkv/go/client"
)

// rolling restarts every node one after another (SIGTERM, start again with the same id and
// data) under a read-mostly load that rewrites what it misses, like an engine recomputing
// a block. Values are a pure function of the key (KV-cache keys name their content), so any
// byte that differs is wrong, whichever node served it.

type rollingOptions struct {
	options
	keys, valueSize, workers int
	warm, settle             time.Duration
}

type loadStats struct {
	hits, misses, errs, wrong atomic.Int64
}

type second struct{ hits, misses int64 }

func rollingMain(args []string, stdout, stderr io.Writer) int {
	o := rollingOptions{}
	fs := o.modeFlags("rolling", stderr, 15*time.Minute)
	fs.IntVar(&o.keys, "keys", 20000, "keys of the load")
	fs.IntVar(&o.valueSize, "value", 4096, "value bytes")
	fs.IntVar(&o.workers, "workers", 4, "load goroutines (one library client)")
	fs.DurationVar(&o.warm, "warm", 10*time.Second, "load before the restarts (the reference hit ratio)")
	fs.DurationVar(&o.settle, "settle", 30*time.Second, "load after the last restart")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.nodes < 2 || o.keys < 1 || o.valueSize < 16 || o.workers < 1 {
		fmt.Fprintln(stderr, "dfkv_cluster rolling: want --nodes >= 2, --keys >= 1, --value >= 16, --workers >= 1")
		return 2
	}
	return runBounded(o.options, stderr, func(ctx context.Context, log *slog.Logger) error { return rolling(ctx, o, log, stdout) })
}

func rollValue(dst []byte, key int) {
	binary.LittleEndian.PutUint64(dst, uint64(key))
	r := rand.New(rand.NewPCG(uint64(key), 0x9e3779b97f4a7c15))
	for i := 8; i < len(dst); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(dst[i:], w[:])
	}
}

func rolling(ctx context.Context, o rollingOptions, log *slog.Logger, w io.Writer) error {
	c, ids, stop, err := bringUp(ctx, o.options, 0, log)
	if err != nil {
		return err
	}
	defer stop()
	mem, cl, err := libClient(c.mdsEP, o.group, "rolling")
	if err != nil {
		return err
	}
	defer mem.Close()
	defer cl.Close()
	if err := waitUntil(ctx, 30*time.Second, 10*time.Millisecond, "the client routes by every node", func() bool { return len(mem.View().Members) == o.nodes }); err != nil {
		return err
	}
	val := make([]byte, o.valueSize)
	for k := 0; k < o.keys; k++ {
		rollValue(val, k)
		if err := cl.Put(ctx, []byte(fmt.Sprintf("r-%d", k)), val); err != nil {
			return fmt.Errorf("seeding key %d: %w", k, err)
		}
	}
	log.Info("seeded", "keys", o.keys, "value", o.valueSize)

	var st loadStats
	var secMu sync.Mutex
	var secs []second
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for wk := 0; wk < o.workers; wk++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(wk), 7))
			buf, want := make([]byte, o.valueSize), make([]byte, o.valueSize)
			for lctx.Err() == nil {
				k := r.IntN(o.keys)
				key := []byte(fmt.Sprintf("r-%d", k))
				rollValue(want, k)
				n, err := cl.GetAuto(lctx, key, buf)
				switch {
				case err == nil && bytes.Equal(buf[:n], want):
					st.hits.Add(1)
				case err == nil:
					st.wrong.Add(1)
				case errors.Is(err, client.ErrNotFound):
					st.misses.Add(1)
					_ = cl.Put(lctx, key, want) // recompute and store, as an engine does
				default:
					st.errs.Add(1)
					st.misses.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // one hit/miss sample a second
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var lh, lm int64
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			h, m := st.hits.Load(), st.misses.Load()
			secMu.Lock()
			secs = append(secs, second{h - lh, m - lm})
			secMu.Unlock()
			lh, lm = h, m
		}
	}()
	ratio := func(from, to int) float64 {
		secMu.Lock()
		defer secMu.Unlock()
		var h, m int64
		for i := max(from, 0); i < min(to, len(secs)); i++ {
			h, m = h+secs[i].hits, m+secs[i].misses
		}
		if h+m == 0 {
			return 0
		}
		return float64(h) / float64(h+m)
	}
	nsecs := func() int { secMu.Lock(); defer secMu.Unlock(); return len(secs) }
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(o.warm); err != nil {
		return err
	}
	before := ratio(0, nsecs())
	log.Info("reference hit ratio", "ratio", fmt.Sprintf("%.4f", before))
	rollStart := time.Now()
	for _, id := range ids {
		if err := c.node(id).proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
			return err
		}
		if _, err := c.startNode(ctx, id); err != nil {
			return err
		}
	}
	lastAt := nsecs()
	rollTook := time.Since(rollStart)
	log.Info("every node restarted", "took", rollTook.Round(time.Millisecond))
	if err := sleep(o.settle); err != nil {
		return err
	}
	stopLoad()
	wg.Wait()
	// Recovery: the first second after the last restart from which every 1 s sample is at
	// or above 95% of the reference ratio.
	recovered := -1
	secMu.Lock()
	for i := lastAt; i < len(secs); i++ {
		ok := true
		for j := i; j < len(secs); j++ {
			s := secs[j]
			if s.hits+s.misses == 0 || float64(s.hits)/float64(s.hits+s.misses) < 0.95*before {
				ok = false
				break
			}
		}
		if ok {
			recovered = i - lastAt
			break
		}
	}
	total := len(secs)
	secMu.Unlock()
	fmt.Fprintf(w, "rolling restart: %d nodes one after another (SIGTERM, restart with the same data) in %v under %d workers, %d keys of %d B\n",
		o.nodes, rollTook.Round(time.Millisecond), o.workers, o.keys, o.valueSize)
	during := "n/a (under 1 s)"
	if from := int(o.warm / time.Second); lastAt > from {
		during = fmt.Sprintf("%.4f", ratio(from, lastAt))
	}
	fmt.Fprintf(w, "hit ratio: %.4f before, %s during the restarts, %.4f over the %v after\n", before, during, ratio(lastAt, total), o.settle)
	if recovered >= 0 {
		fmt.Fprintf(w, "back to >= 95%% of before (every 1 s sample) %d s after the last restart\n", recovered)
	} else {
		fmt.Fprintf(w, "NOT back to >= 95%% of before within %v of the last restart\n", o.settle)
	}
	fmt.Fprintf(w, "reads: %d hits, %d misses, %d errors, %d wrong bytes\n", st.hits.Load(), st.misses.Load(), st.errs.Load(), st.wrong.Load())
	if st.wrong.Load() != 0 || recovered < 0 {
		return fmt.Errorf("rolling restart: %d wrong reads, recovered=%v", st.wrong.Load(), recovered >= 0)
	}
	return nil
}
