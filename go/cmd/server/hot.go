//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// hotOptions are the hot-object spreading flags (docs/ARCHITECTURE.md "Hot objects").
type hotOptions struct {
	on           bool
	members      string
	maxReplicas  int
	minReads     int
	share        float64
	lease        time.Duration
	interval     time.Duration
	noInvalidate bool
}

func addHotFlags(fs *flag.FlagSet, o *hotOptions) {
	fs.BoolVar(&o.on, "hot-spread", false, "spread hot objects: copy a key read far above the others to the next ring owners as read replicas, and hold the replicas other nodes push here")
	fs.StringVar(&o.members, "hot-members", "", "the ring for --hot-spread as id=host:port,... (default: follow --mds's group)")
	fs.IntVar(&o.maxReplicas, "hot-max-replicas", 8, "most replicas of one hot key (1..127)")
	fs.IntVar(&o.minReads, "hot-min-reads", 64, "reads of a key in one interval below which it is never hot")
	fs.Float64Var(&o.share, "hot-share", 0.1, "a key gets one copy per this share of the node's other reads (0 < share <= 1)")
	fs.DurationVar(&o.lease, "hot-lease", 3*time.Second, "replica lifetime without renewal; a write that cannot reach a replica waits at most this")
	fs.DurationVar(&o.interval, "hot-interval", time.Second, "heat measurement interval")
	fs.BoolVar(&o.noInvalidate, "hot-test-no-invalidate", false, "TEST ONLY: writes leave replicas in place (shows why invalidation exists); never in production")
}

func (o *hotOptions) validate(mds *mdsFlags, rdma bool) error {
	if !o.on {
		return nil
	}
	switch {
	case o.maxReplicas < 1 || o.maxReplicas > wire.MaxHotReplicas:
		return fmt.Errorf("--hot-max-replicas %d: want 1..%d", o.maxReplicas, wire.MaxHotReplicas)
	case o.minReads < 1:
		return fmt.Errorf("--hot-min-reads %d: want at least 1", o.minReads)
	case !(o.share > 0 && o.share <= 1):
		return fmt.Errorf("--hot-share %v: want 0 < share <= 1", o.share)
	case o.lease < 100*time.Millisecond || o.lease > time.Minute:
		return fmt.Errorf("--hot-lease %v: want 100ms..1m", o.lease)
	case o.interval < 10*time.Millisecond || o.interval > o.lease:
		return fmt.Errorf("--hot-interval %v: want 10ms..--hot-lease", o.interval)
	case o.members == "" && mds.endpoints == "":
		return errors.New("--hot-spread needs the ring: --mds or --hot-members")
	case rdma:
		// RDMA writes reach the engine without the TCP path's invalidation of replicas.
		return errors.New("--hot-spread with --rdma is not supported yet")
	case mds.fs != nil && mds.flagValue("auth-tokens") != "":
		// Replica pushes need an admin token between nodes; not wired yet.
		return errors.New("--hot-spread with --auth-tokens is not supported yet")
	}
	if o.members != "" {
		if _, err := client.ParseMembers(o.members); err != nil {
			return fmt.Errorf("--hot-members: %w", err)
		}
	}
	return nil
}

// hotPeers implements server.HotPeers with the client library: the view says who follows
// a key's owner, a node-to-node client carries the pushes and invalidations.
type hotPeers struct {
	self string
	ms   client.Membership
	c    *client.Client
}

func (p *hotPeers) Replicas(id identity.ObjectID, n int) ([]string, bool) {
	owners := p.ms.View().Owners(id.Hi, n+1)
	if len(owners) == 0 || owners[0].Addr != p.self {
		return nil, false
	}
	addrs := make([]string, 0, len(owners)-1)
	for _, m := range owners[1:] {
		addrs = append(addrs, m.Addr)
	}
	return addrs, true
}

func (p *hotPeers) Push(ctx context.Context, addr string, key store.Key, gen uint64, lease time.Duration, value []byte) (uint64, error) {
	return p.c.ReplicaPut(ctx, addr, key.Tenant, key.ID, gen, lease, value)
}

func (p *hotPeers) Invalidate(ctx context.Context, addr string, key store.Key, gen uint64) error {
	return p.c.ReplicaInvalidate(ctx, addr, key.Tenant, key.ID, gen)
}

// startHot builds the node's hot-object state; bound is the listener's address. The
// returned func stops it.
func startHot(o hotOptions, mds *mdsFlags, bound string, engine store.Engine, reg prometheus.Registerer, log *slog.Logger) (*server.Hot, func(), error) {
	self := bound
	var ms client.Membership
	if o.members != "" {
		members, err := client.ParseMembers(o.members)
		if err != nil {
			return nil, nil, fmt.Errorf("--hot-members: %w", err)
		}
		if ms, err = client.NewStatic(members); err != nil {
			return nil, nil, fmt.Errorf("--hot-members: %w", err)
		}
	} else {
		if host, port, _ := net.SplitHostPort(mds.advert); port == "0" {
			_, bp, _ := net.SplitHostPort(bound)
			self = net.JoinHostPort(host, bp)
		} else if mds.advert != "" {
			self = mds.advert
		}
		eps, err := mdsclient.ParseEndpoints(mds.endpoints)
		if err != nil {
			return nil, nil, err
		}
		ropts, err := mds.rpcOptions()
		if err != nil {
			return nil, nil, err
		}
		m, err := client.NewMDSMembership(client.MDSOptions{Endpoints: eps, Group: mds.group, Logger: log,
			TLS: ropts.TLS, Token: ropts.Token})
		if err != nil {
			return nil, nil, fmt.Errorf("--hot-spread: %w", err)
		}
		ms = m
	}
	c, err := client.New(client.Options{Membership: ms, NoHotSpread: true, IOTimeout: time.Second, Cooldown: 500 * time.Millisecond,
		Logger: log, PoolSize: 4})
	if err != nil {
		_ = ms.Close()
		return nil, nil, err
	}
	h, err := server.NewHot(server.HotConfig{Peers: &hotPeers{self: self, ms: ms, c: c}, Interval: o.interval,
		MinReads: o.minReads, Share: o.share, MaxReplicas: o.maxReplicas, Lease: o.lease, NoInvalidate: o.noInvalidate,
		Logger: log}, engine, reg)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	h.Start()
	log.Info("hot-object spreading on", "self", self, "ring", strings.TrimSpace(map[bool]string{true: "static", false: "mds"}[o.members != ""]),
		"max_replicas", o.maxReplicas, "lease", o.lease, "no_invalidate", o.noInvalidate)
	return h, func() { h.Close(); _ = c.Close() }, nil
}
