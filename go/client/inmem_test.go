package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/inmem"
)

// Client and server over the in-memory transport: the network faults a socket test cannot
// produce on demand (partition, black hole, delay) without any socket.

type inmemCluster struct {
	net   *inmem.Network
	addrs map[string]string // node id -> address
	c     *client.Client
}

func newInmemCluster(t *testing.T, ids ...string) *inmemCluster {
	t.Helper()
	k := &inmemCluster{net: inmem.NewNetwork(), addrs: map[string]string{}}
	var members []client.Member
	for _, id := range ids {
		srv, err := server.New(server.Config{Engine: store.NewMem(8 << 20)})
		if err != nil {
			t.Fatal(err)
		}
		l, err := k.net.Listen(id + ":7000")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
		k.addrs[id] = l.Addr().String()
		members = append(members, client.Member{ID: id, Addr: l.Addr().String(), Weight: 1})
	}
	ms, err := client.NewStatic(members)
	if err != nil {
		t.Fatal(err)
	}
	k.c, err = client.New(client.Options{Membership: ms, Dialer: k.net.Dialer(),
		IOTimeout: 300 * time.Millisecond, ConnectTimeout: 300 * time.Millisecond, Cooldown: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.c.Close() })
	if k.c.TransportMode() != "inmem" {
		t.Fatalf("transport mode %q", k.c.TransportMode())
	}
	return k
}

func (k *inmemCluster) owner(key []byte) string {
	m, _ := k.c.View().Owner(k.c.ID(key).Hi)
	return m.ID
}

func inmemKey(i int) []byte { return []byte(fmt.Sprintf("key-%03d", i)) }
func inmemVal(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, 1000+i) }

// putAll stores 60 keys and returns the ids of their owners.
func (k *inmemCluster) putAll(t *testing.T) map[int]string {
	t.Helper()
	owners := map[int]string{}
	for i := range 60 {
		if err := k.c.Put(context.Background(), inmemKey(i), inmemVal(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		owners[i] = k.owner(inmemKey(i))
	}
	return owners
}

func (k *inmemCluster) get(i int) error {
	buf := make([]byte, len(inmemVal(i)))
	if err := k.c.Get(context.Background(), inmemKey(i), buf); err != nil {
		return err
	}
	if !bytes.Equal(buf, inmemVal(i)) {
		return errors.New("wrong bytes")
	}
	return nil
}

func TestInmemPartitionFailsFastAndHeals(t *testing.T) {
	k := newInmemCluster(t, "n1", "n2", "n3")
	owners := k.putAll(t)
	k.net.Partition(k.addrs["n2"])
	onN2 := 0
	for i, o := range owners {
		err := k.get(i)
		if o != "n2" {
			if err != nil {
				t.Fatalf("key %d on %s failed while only n2 is cut off: %v", i, o, err)
			}
			continue
		}
		onN2++
		if err == nil {
			t.Fatalf("key %d read from partitioned n2", i)
		}
		if errors.Is(err, client.ErrNotFound) || err.Error() == "wrong bytes" {
			t.Fatalf("key %d: a partition must read as unavailable, got %v", i, err)
		}
	}
	if onN2 == 0 {
		t.Fatal("no key landed on n2: the test checked nothing")
	}
	k.net.Heal(k.addrs["n2"])
	// After the cool-down every key reads back exactly (the event: a successful read).
	deadline := time.Now().Add(5 * time.Second)
	for i := range owners {
		for {
			err := k.get(i)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %d after heal: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !bytes.Contains(k.c.Snapshot(), []byte("dfkv_client_peer_cooldowns_total")) {
		t.Fatal("the partition started no cool-down")
	}
}

// A peer that swallows traffic costs at most the request deadline, never a hang.
func TestInmemBlackholeBoundedByDeadline(t *testing.T) {
	k := newInmemCluster(t, "n1")
	k.putAll(t)
	k.net.Blackhole(k.addrs["n1"])
	done := make(chan error, 1)
	go func() { done <- k.get(7) }()
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrTimeout) && !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("get from a black hole = %v, want a timeout", err)
		}
	case <-time.After(20 * time.Second): // far beyond IOTimeout (300ms): a hang, not slowness
		t.Fatal("get from a black-holed peer hung")
	}
	k.net.Heal(k.addrs["n1"])
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := k.get(7)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after heal: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Delay within the deadline changes nothing but latency; bytes stay exact.
func TestInmemDelay(t *testing.T) {
	k := newInmemCluster(t, "n1", "n2")
	owners := k.putAll(t)
	k.net.Delay(k.addrs["n1"], 5*time.Millisecond)
	for i := range owners {
		if err := k.get(i); err != nil {
			t.Fatalf("key %d with a delayed n1: %v", i, err)
		}
	}
	items := make([]client.Item, 0, len(owners))
	for i := range owners {
		items = append(items, client.Item{Key: inmemKey(i), Buf: make([]byte, len(inmemVal(i)))})
	}
	if err := k.c.BatchGet(context.Background(), items, client.Exact); err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		var i int
		fmt.Sscanf(string(it.Key), "key-%03d", &i)
		if it.Err != nil || !bytes.Equal(it.Buf, inmemVal(i)) {
			t.Fatalf("batch item %s: %v", it.Key, it.Err)
		}
	}
}
