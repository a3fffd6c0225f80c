//go:build linux

// Command dfkv_bench is dfkv's load generator and the harness that measures its baselines
// with the same code, sizes, connection counts and percentiles.
//
//	dfkv_bench [--target dfkv|rawtcp|redis|memcached|odirect] --op put|get|exist|mixed --size 1MiB
//	           --conns 4 --batch 1 --keys N (--duration 10s | --count N) [--warmup 1s] [--seed]
//	           [--members id=host:port,... | --node host:port | --addr host:port | --file F] [--json]
//	dfkv_bench rawserver --listen 127.0.0.1:0 --addr-file F   (the raw TCP baseline server)
//	dfkv_bench odirect-prep --file F --bytes 384MiB           (the file --target odirect reads)
//	dfkv_bench tls-testcerts --dir D [--hosts 127.0.0.1]      (throwaway CA, server and client certs)
//	dfkv_bench trace --trace F --members ... --block-bytes N  (hit rate on an inference trace)
//
// Targets: dfkv drives dfkv nodes through the Go client (one client shared by every worker;
// the client pools connections per peer); rawtcp drives `dfkv_bench rawserver`, a trivial
// request/reply protocol that does no work beyond moving the bytes (the wire-speed
// reference); redis speaks RESP2 SET/GET/EXISTS; memcached speaks the text protocol
// (set/get, mg for exist); odirect does O_DIRECT preads/pwrites of whole blocks at
// block-aligned offsets of a preallocated file (the device-speed reference for cold GETs;
// see odirect.go). Each baseline worker owns one TCP connection. A call of --batch
// items is the system's batch form (dfkv BatchPut/BatchGet/BatchExist) or, for the
// baselines, that many pipelined requests.
//
// Each worker loops over random keys of the key space with preallocated keys and buffers (no
// allocation per operation in the harness). PUT values carry their key's index in their
// first 8 bytes and GETs check it (--verify), so misrouted or stale data counts as an error.
// The run always ends by itself: after --duration, after --count items, or at --max-time.
//
// trace replays an inference trace (Mooncake format, testdata/traces) request by request:
// lookup, GET of the hit prefix with every byte verified, PUT of the rest; it reports the
// prefix hit ratio next to an exact LRU simulation at the cluster's capacity in blocks and
// an infinite cache (trace.go, trace_replay.go).
//
// Reported: items/s, GB/s (10^9 bytes of value moved per second), latency per call
// p50/p90/p99/p999/max, errors and misses. Exit status: 0 success, 1 some requested item
// failed (or missed, with --strict), 2 setup error (bad flags, unreachable target, failed
// seeding).
package main

import (
	"os"
)

const (
	exitOK    = 0
	exitFail  = 1
	exitSetup = 2
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rawserver" {
		os.Exit(rawServe(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "tls-testcerts" {
		os.Exit(tlsTestCerts(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "trace" {
		os.Exit(traceMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "odirect-prep" {
		os.Exit(odirectPrep(os.Args[2:], os.Stderr))
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}
