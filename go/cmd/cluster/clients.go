//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/mdsclient"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// Simulated clients. A "light" client does on the wire exactly what the library's MDS
// membership does (a registration kept alive by heartbeats, back-to-back topology long
// polls) and records when each MembersEpoch arrived, without building a ring: a thousand
// of them in one process measure what the MDS delivers, not how fast two shared cores can
// build a thousand rings (the ring build is measured on its own: go/ring BenchmarkNew1000).
// A "full" client is the library's own client.MDSMembership; the harness samples its
// View() to measure when it routes by the new ring.

// countingConn counts the bytes a client moves on its MDS connections.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	k, err := c.Conn.Read(b)
	c.n.Add(int64(k))
	return k, err
}

func (c countingConn) Write(b []byte) (int, error) {
	k, err := c.Conn.Write(b)
	c.n.Add(int64(k))
	return k, err
}

type lightClient struct {
	id     string
	rpc    *mdsclient.Client
	holder *mdsclient.Holder

	mu      sync.Mutex
	arrived []arrival // every MembersEpoch change, in order
}

// arrival is a client's move to a MembersEpoch. Epochs are content hashes, so a ring that
// returns to an earlier membership has an earlier epoch again: events are matched by time.
type arrival struct {
	at    time.Time
	epoch uint64
}

func seenAfter(as []arrival, epoch uint64, since time.Time) (time.Time, bool) {
	for _, a := range as {
		if a.epoch == epoch && !a.at.Before(since) {
			return a.at, true
		}
	}
	return time.Time{}, false
}

func (l *lightClient) seen(epoch uint64, since time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return seenAfter(l.arrived, epoch, since)
}

// fleet is every simulated client.
type fleet struct {
	light []*lightClient
	full  []*client.MDSMembership
	bytes atomic.Int64 // both directions, light clients' MDS connections

	fullMu   sync.Mutex
	fullSeen [][]arrival // per full client: its View's epoch changes

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startFleet(eps []string, group string, nLight, nFull int, longPoll time.Duration) (*fleet, error) {
	f := &fleet{}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{nc, &f.bytes}, nil
	}
	for i := 0; i < nLight; i++ {
		// Half the fleet lists the replicas in the other order, as a real fleet's
		// configuration might: both replicas carry load.
		ceps := append([]string(nil), eps...)
		if i%2 == 1 {
			for a, b := 0, len(ceps)-1; a < b; a, b = a+1, b-1 {
				ceps[a], ceps[b] = ceps[b], ceps[a]
			}
		}
		opts := mdsclient.Options{CallTimeout: 2 * time.Second, Dial: dial}
		rpc, err := mdsclient.New(ceps, opts)
		if err != nil {
			f.stop()
			return nil, err
		}
		hrpc, _ := mdsclient.New(ceps, opts)
		id := fmt.Sprintf("sim-%04d", i)
		h, err := mdsclient.NewHolder(mdsclient.HolderConfig{Client: hrpc, Group: group, Logger: quiet,
			Info: &wire.ClientInfo{ID: id, Info: []wire.KV{{Key: "engine", Value: "dfkv_cluster"}}, Hostname: "harness", RegisteredUnixMS: uint64(time.Now().UnixMilli())}})
		if err != nil {
			f.stop()
			return nil, err
		}
		l := &lightClient{id: id, rpc: rpc, holder: h}
		f.light = append(f.light, l)
		h.Start()
		f.wg.Add(1)
		go f.follow(l, group, longPoll)
	}
	for i := 0; i < nFull; i++ {
		m, err := client.NewMDSMembership(client.MDSOptions{Endpoints: eps, Group: group, Logger: quiet})
		if err != nil {
			f.stop()
			return nil, err
		}
		f.full = append(f.full, m)
		f.fullSeen = append(f.fullSeen, []arrival{{time.Now(), m.View().Epoch}})
	}
	if nFull > 0 {
		f.wg.Add(1)
		go f.sampleFull()
	}
	return f, nil
}

// follow is a light client's topology loop: the requests client.MDSMembership sends.
func (f *fleet) follow(l *lightClient, group string, longPoll time.Duration) {
	defer f.wg.Done()
	var knownMembers, knownTopo uint64
	for f.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(f.ctx, longPoll+6*time.Second)
		resp, _, err := l.rpc.Call(ctx, &wire.MdsRequest{Op: fb.MdsOpListTopology, Group: group, KnownMembersEpoch: knownMembers,
			WaitMS: uint32(longPoll / time.Millisecond), KnownTopologyEpoch: knownTopo})
		cancel()
		now := time.Now()
		if err != nil || resp.WaitMS == 0 {
			select { // an error or an MDS that does not hold polls: the library's Poll fallback
			case <-f.ctx.Done():
			case <-time.After(3 * time.Second):
			}
		}
		if err != nil || resp.Topology == nil {
			continue
		}
		if resp.Topology.MembersEpoch != knownMembers {
			l.mu.Lock()
			l.arrived = append(l.arrived, arrival{now, resp.Topology.MembersEpoch})
			l.mu.Unlock()
		}
		knownMembers, knownTopo = resp.Topology.MembersEpoch, resp.Topology.TopologyEpoch
	}
}

func (f *fleet) sampleFull() {
	defer f.wg.Done()
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		f.fullMu.Lock()
		for i, m := range f.full {
			if e := m.View().Epoch; e != f.fullSeen[i][len(f.fullSeen[i])-1].epoch {
				f.fullSeen[i] = append(f.fullSeen[i], arrival{now, e})
			}
		}
		f.fullMu.Unlock()
	}
}

func (f *fleet) fullSeenAt(i int, epoch uint64, since time.Time) (time.Time, bool) {
	f.fullMu.Lock()
	defer f.fullMu.Unlock()
	return seenAfter(f.fullSeen[i], epoch, since)
}

func (f *fleet) registered() int {
	n := 0
	for _, l := range f.light {
		if l.holder.Registered() {
			n++
		}
	}
	return n
}

func (f *fleet) stop() {
	f.cancel()
	for _, m := range f.full {
		m.Close()
	}
	var wg sync.WaitGroup
	for _, l := range f.light {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_ = l.holder.Stop(ctx)
			cancel()
			l.rpc.Close()
		}()
	}
	wg.Wait()
	f.wg.Wait()
}

// libClient is one library client (its own MDS membership and connections) in namespace ns.
func libClient(eps []string, group, ns string) (*client.MDSMembership, *client.Client, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := client.NewMDSMembership(client.MDSOptions{Endpoints: eps, Group: group, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.New(client.Options{Membership: m, Namespace: []byte(ns), Logger: quiet})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, cl, nil
}
