package mds

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdStore is the Store over a real etcd cluster (v3 API).
type EtcdStore struct {
	cli *clientv3.Client
}

// healthKey is read (count only) by Ping; it never exists.
const healthKey = "/dfkv/v1/health"

// NewEtcdStore connects to endpoints (host:port or URLs). It does not wait for etcd to be
// reachable: calls fail with ErrBackend until it is.
func NewEtcdStore(endpoints []string, dialTimeout time.Duration) (*EtcdStore, error) {
	return NewEtcdStoreTLS(endpoints, dialTimeout, nil)
}

// NewEtcdStoreTLS is NewEtcdStore over TLS (tlsCfg nil = plaintext): an external etcd run
// with --client-cert-auth and https client URLs.
func NewEtcdStoreTLS(endpoints []string, dialTimeout time.Duration, tlsCfg *tls.Config) (*EtcdStore, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("mds: no etcd endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
		AutoSyncInterval:     0,
		TLS:                  tlsCfg,
	})
	if err != nil {
		return nil, fmt.Errorf("mds: etcd client: %w", err)
	}
	return &EtcdStore{cli: cli}, nil
}

func backend(op string, err error) error {
	if errors.Is(err, ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrBackend, op, err)
}

func leaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || (err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCLeaseNotFound))
}

func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Put reuses the key's live lease (renewing it) or grants a new one.
func (s *EtcdStore) Put(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	get, err := s.cli.Get(ctx, key)
	if err != nil {
		return backend("get", err)
	}
	if len(get.Kvs) == 1 && get.Kvs[0].Lease != 0 {
		lease := clientv3.LeaseID(get.Kvs[0].Lease)
		ka, err := s.cli.KeepAliveOnce(ctx, lease)
		switch {
		case err == nil && ka.TTL > 0:
			if _, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(lease)); err == nil {
				return nil
			} else if !leaseGone(err) {
				return backend("put", err)
			}
		case err != nil && !leaseGone(err):
			return backend("keepalive", err)
		}
	}
	g, err := s.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return backend("grant", err)
	}
	if _, err := s.cli.Put(ctx, key, string(value), clientv3.WithLease(g.ID)); err != nil {
		return backend("put", err)
	}
	return nil
}

// KeepAlive renews key's lease and rewrites a changed value under it.
func (s *EtcdStore) KeepAlive(ctx context.Context, key string, value []byte) error {
	get, err := s.cli.Get(ctx, key)
	if err != nil {
		return backend("get", err)
	}
	if len(get.Kvs) != 1 || get.Kvs[0].Lease == 0 {
		return ErrNotFound
	}
	kv := get.Kvs[0]
	lease := clientv3.LeaseID(kv.Lease)
	ka, err := s.cli.KeepAliveOnce(ctx, lease)
	if leaseGone(err) || (err == nil && ka.TTL <= 0) {
		return ErrNotFound
	}
	if err != nil {
		return backend("keepalive", err)
	}
	if value != nil && !bytes.Equal(value, kv.Value) {
		// Only while the key is still the one we renewed (no concurrent re-registration).
		_, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(value), clientv3.WithLease(lease))).Commit()
		if err != nil {
			if leaseGone(err) {
				return ErrNotFound
			}
			return backend("update", err)
		}
	}
	return nil
}

// Delete deletes the key in one etcd write. Its lease (one per key) is left to expire on
// its own (at most the TTL: its holder has stopped renewing it): revoking it instead, after
// a linearizable read to find it, cost two raft round trips on the path of every drain, and
// a drain is seen by the clients only once the watch delivers the delete.
func (s *EtcdStore) Delete(ctx context.Context, key string) error {
	if _, err := s.cli.Delete(ctx, key); err != nil {
		return backend("delete", err)
	}
	return nil
}

// List reads up to limit keys under prefix.
func (s *EtcdStore) List(ctx context.Context, prefix string, limit int) ([]KV, error) {
	kvs, _, err := s.ListRev(ctx, prefix, limit)
	return kvs, err
}

// ListRev is List with the revision of the (linearizable) read.
func (s *EtcdStore) ListRev(ctx context.Context, prefix string, limit int) ([]KV, int64, error) {
	get, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(int64(limit)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, backend("list", err)
	}
	out := make([]KV, len(get.Kvs))
	for i, kv := range get.Kvs {
		out[i] = KV{Key: string(kv.Key), Value: kv.Value}
	}
	return out, get.Header.Revision, nil
}

// Watch streams changes under prefix from rev on. WithRequireLeader ends the watch when the
// etcd member it is attached to loses its leader (a partitioned member would otherwise
// just go quiet); the caller then lists again through a member that has a quorum.
func (s *EtcdStore) Watch(ctx context.Context, prefix string, rev int64) <-chan struct{} {
	out := make(chan struct{}, 1)
	wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
	go func() {
		defer close(out)
		for wr := range wch {
			if wr.Err() != nil || wr.Canceled {
				// Drain until clientv3 closes the channel (it does once ctx ends).
				go func() {
					for range wch {
					}
				}()
				return
			}
			if len(wr.Events) > 0 {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// Ping runs a linearizable count-only read: it succeeds only when a quorum answers.
func (s *EtcdStore) Ping(ctx context.Context) error {
	if _, err := s.cli.Get(ctx, healthKey, clientv3.WithCountOnly()); err != nil {
		return backend("ping", err)
	}
	return nil
}

// Close closes the etcd client.
func (s *EtcdStore) Close() error { return s.cli.Close() }
