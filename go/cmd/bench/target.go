//go:build linux

package main

import (
	"errors"
	"fmt"
	"time"
)

// errMiss marks an item whose key is absent (a clean miss, not a failure).
var errMiss = errors.New("miss")

// errCorrupt marks a GET whose bytes do not carry the key's stamp.
var errCorrupt = errors.New("value does not match its key")

// A target is one system under test. newConn returns the per-worker handle; a target with a
// shared client (dfkv) returns handles sharing it, the baselines open one TCP connection per
// worker.
type target interface {
	name() string
	newConn() (conn, error)
	close() error
}

// conn executes calls of len(keys) items (1 = single ops; more = the system's batch or
// pipelined form). Each item's outcome goes to res[i] (nil, errMiss, or a failure); the
// returned error is a failure of the whole call (every item counts as failed). Implementations
// must not allocate per call in the steady state.
type conn interface {
	put(keys, vals [][]byte, res []error) error
	// get fills bufs[i] (exactly len(bufs[i]) bytes expected) and reports hits in res.
	get(keys, bufs [][]byte, res []error) error
	exist(keys [][]byte, res []error) error
	close() error
}

type targetConfig struct {
	kind      string // dfkv, rawtcp, redis, memcached, odirect
	members   string // dfkv membership
	addr      string // baselines (and a one-node dfkv)
	ns        string
	conns     int
	batch     int
	ioTimeout time.Duration
	getAuto   bool
	blocking  bool // client.Options.BlockingIO
	bconc     int
	poolSize  int
	file      string // odirect
	verify    bool   // odirect checks its sector stamps itself
	// dfkv connection security (TLS when any tls* is set)
	tlsCA, tlsCert, tlsKey, token string
	// dfkv: "tcp" or "rdma", and the RDMA provider
	transport, rdmaProvider string
	rdmaDev                 string
}

func openTarget(cfg targetConfig, size int64) (target, error) {
	switch cfg.kind {
	case "dfkv":
		return openDfkv(cfg, size)
	case "rawtcp":
		return &tcpTarget{kind: "rawtcp", cfg: cfg, dial: dialRaw}, nil
	case "redis":
		return &tcpTarget{kind: "redis", cfg: cfg, dial: dialRedis}, nil
	case "memcached":
		return &tcpTarget{kind: "memcached", cfg: cfg, dial: dialMemcached}, nil
	case "odirect":
		return openODirectTarget(cfg, size)
	}
	return nil, fmt.Errorf("unknown --target %q (want dfkv, rawtcp, redis, memcached or odirect)", cfg.kind)
}

// tcpTarget is a baseline reached over one plain TCP connection per worker.
type tcpTarget struct {
	kind string
	cfg  targetConfig
	dial func(cfg targetConfig) (conn, error)
}

func (t *tcpTarget) name() string { return t.kind }
func (t *tcpTarget) newConn() (conn, error) {
	if t.cfg.addr == "" {
		return nil, fmt.Errorf("--target %s needs --addr host:port", t.kind)
	}
	return t.dial(t.cfg)
}
func (t *tcpTarget) close() error { return nil }
