//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/dfkv/dfkv/go/client"
)

// dfkvTarget drives dfkv through the Go client: one client shared by every worker (the
// client pools connections per peer), as an application would use it.
type dfkvTarget struct {
	c    *client.Client
	auto bool
	rdma bool
}

func openDfkv(cfg targetConfig, size int64) (target, error) {
	var rdma *client.RDMAOptions
	switch cfg.transport {
	case "", "tcp":
	case "rdma":
		rdma = &client.RDMAOptions{Provider: cfg.rdmaProvider, Device: cfg.rdmaDev, MaxBlock: uint64(max(size, 4<<20))}
	default:
		return nil, fmt.Errorf("--transport %q: want tcp or rdma", cfg.transport)
	}
	spec := cfg.members
	if spec == "" && cfg.addr != "" {
		spec = "n1=" + cfg.addr
	}
	if spec == "" {
		return nil, errors.New("--target dfkv needs --members id=host:port,... or --node host:port")
	}
	members, err := client.ParseMembers(spec)
	if err != nil {
		return nil, err
	}
	ms, err := client.NewStatic(members)
	if err != nil {
		return nil, err
	}
	bconc := cfg.bconc
	if bconc <= 0 {
		bconc = 4
	}
	pool := cfg.poolSize
	if pool <= 0 {
		// Enough idle connections that no worker ever dials mid-run.
		pool = max(16, cfg.conns*bconc*len(members))
	}
	var tlsCfg *tls.Config
	if cfg.tlsCA != "" || cfg.tlsCert != "" || cfg.tlsKey != "" {
		if tlsCfg, err = client.TLSFromFiles(cfg.tlsCA, cfg.tlsCert, cfg.tlsKey); err != nil {
			return nil, err
		}
	}
	c, err := client.New(client.Options{
		TLS: tlsCfg, Token: cfg.token,
		Membership:       ms,
		Namespace:        []byte(cfg.ns),
		IOTimeout:        cfg.ioTimeout,
		BatchConcurrency: bconc,
		PoolSize:         pool,
		BlockingIO:       cfg.blocking,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		RDMA:             rdma,
	})
	if err != nil {
		return nil, err
	}
	return &dfkvTarget{c: c, auto: cfg.getAuto, rdma: rdma != nil}, nil
}

func (t *dfkvTarget) name() string {
	if t.rdma {
		return "dfkv+rdma"
	}
	return "dfkv"
}

// check fails a --transport rdma run that did not use RDMA.
func (t *dfkvTarget) check() error {
	if m := t.c.TransportMode(); t.rdma && m != "rdma" {
		return fmt.Errorf("--transport rdma: RDMA not in use: %s", m)
	}
	return nil
}
func (t *dfkvTarget) close() error { return t.c.Close() }

func (t *dfkvTarget) newConn() (conn, error) {
	return &dfkvConn{t: t}, nil
}

// dfkvConn is a worker's view of the shared client; items is its reusable batch array.
type dfkvConn struct {
	t     *dfkvTarget
	items []client.Item
}

func (d *dfkvConn) close() error { return nil }

func dfkvErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, client.ErrNotFound) {
		return errMiss
	}
	return err
}

func (d *dfkvConn) batchItems(n int) []client.Item {
	if cap(d.items) < n {
		d.items = make([]client.Item, n)
	}
	d.items = d.items[:n]
	return d.items
}

func (d *dfkvConn) put(keys, vals [][]byte, res []error) error {
	if len(keys) == 1 {
		res[0] = dfkvErr(d.t.c.Put(context.Background(), keys[0], vals[0]))
		return nil
	}
	items := d.batchItems(len(keys))
	for i := range items {
		items[i] = client.Item{Key: keys[i], Value: vals[i]}
	}
	if err := d.t.c.BatchPut(context.Background(), items); err != nil {
		return err
	}
	for i := range items {
		res[i] = dfkvErr(items[i].Err)
	}
	return nil
}

func (d *dfkvConn) get(keys, bufs [][]byte, res []error) error {
	if len(keys) == 1 {
		if d.t.auto {
			n, err := d.t.c.GetAuto(context.Background(), keys[0], bufs[0])
			if err == nil && n != len(bufs[0]) {
				err = fmt.Errorf("got %d bytes, want %d", n, len(bufs[0]))
			}
			res[0] = dfkvErr(err)
		} else {
			res[0] = dfkvErr(d.t.c.Get(context.Background(), keys[0], bufs[0]))
		}
		return nil
	}
	items := d.batchItems(len(keys))
	for i := range items {
		items[i] = client.Item{Key: keys[i], Buf: bufs[i]}
	}
	mode := client.Exact
	if d.t.auto {
		mode = client.Auto
	}
	if err := d.t.c.BatchGet(context.Background(), items, mode); err != nil {
		return err
	}
	for i := range items {
		err := items[i].Err
		if err == nil && items[i].N != int64(len(bufs[i])) {
			err = fmt.Errorf("got %d bytes, want %d", items[i].N, len(bufs[i]))
		}
		res[i] = dfkvErr(err)
	}
	return nil
}

func (d *dfkvConn) exist(keys [][]byte, res []error) error {
	if len(keys) == 1 {
		_, err := d.t.c.Exist(context.Background(), keys[0])
		res[0] = dfkvErr(err)
		return nil
	}
	items := d.batchItems(len(keys))
	for i := range items {
		items[i] = client.Item{Key: keys[i]}
	}
	if err := d.t.c.BatchExist(context.Background(), items); err != nil {
		return err
	}
	for i := range items {
		res[i] = dfkvErr(items[i].Err)
	}
	return nil
}
