package mds

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
	"github.com/dfkv/dfkv/go/ring"
)

// KeyRoot is the prefix of every dfkv key in etcd.
const KeyRoot = "/dfkv/v1/groups/"

// DefaultGroup is used when a request names no group.
const DefaultGroup = "default"

// ErrInvalid marks a request the MDS refuses (answered Invalid).
var ErrInvalid = errors.New("mds: invalid request")

// MembersPrefix and ClientsPrefix return the etcd prefixes of a group.
func MembersPrefix(group string) string { return KeyRoot + group + "/members/" }
func ClientsPrefix(group string) string { return KeyRoot + group + "/clients/" }

// Config configures a Service.
type Config struct {
	Store Store
	// LeaseTTL is the lease of a member (cache node) registration: how long a node that
	// died stays in the ring (default DefaultLeaseTTL).
	LeaseTTL time.Duration
	// ClientLeaseTTL is the lease of a client registration (default DefaultClientLeaseTTL).
	// Clients are never in the ring, so theirs can be long and their heartbeats rare.
	ClientLeaseTTL time.Duration
	// Healthy, when set, reports whether etcd is reachable (the /readyz prober); while it
	// fails, long polls are answered from direct etcd reads, not the watched copy.
	Healthy     func() error
	CallTimeout time.Duration // deadline of one request's etcd work (default 3s)
	MaxList     int           // most keys one list returns (default 65536)
	Logger      *slog.Logger
	Metrics     *Metrics // may be nil
	Now         func() time.Time
}

// Default lease TTLs. A member's bounds how long a dead node keeps receiving its keys'
// requests (its clients cool it down meanwhile): lease expiry, at most one heartbeat
// interval (TTL/3) plus etcd's 500 ms expiry sweep after the death, then a pushed change.
const (
	DefaultLeaseTTL       = 6 * time.Second
	DefaultClientLeaseTTL = 30 * time.Second
)

// Service answers MDS requests. It keeps no membership state of its own: the watched
// copies that answer long polls are derived from etcd (watch.go).
type Service struct {
	cfg Config

	watchMu      sync.Mutex
	watches      map[string]*groupWatch
	waitsStopped bool
	stopWaits    chan struct{}
	watchWG      sync.WaitGroup
}

// NewService validates cfg.
func NewService(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("mds: no store")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.ClientLeaseTTL <= 0 {
		cfg.ClientLeaseTTL = DefaultClientLeaseTTL
	}
	if cfg.LeaseTTL < time.Second || cfg.ClientLeaseTTL < time.Second {
		return nil, fmt.Errorf("mds: lease ttl %v / client lease ttl %v: below 1s", cfg.LeaseTTL, cfg.ClientLeaseTTL)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 3 * time.Second
	}
	if cfg.MaxList <= 0 {
		cfg.MaxList = wire.MaxMdsClients
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, watches: map[string]*groupWatch{}, stopWaits: make(chan struct{})}, nil
}

// LeaseTTL is the lease every member registration gets.
func (s *Service) LeaseTTL() time.Duration { return s.cfg.LeaseTTL }

// ClientLeaseTTL is the lease every client registration gets.
func (s *Service) ClientLeaseTTL() time.Duration { return s.cfg.ClientLeaseTTL }

// validName accepts ids and group names that are safe as one etcd key segment.
func validName(what, s string) error {
	if s == "" || len(s) > wire.MaxMdsIDLen {
		return fmt.Errorf("%w: %s %q: want 1..%d bytes", ErrInvalid, what, s, wire.MaxMdsIDLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '/' {
			return fmt.Errorf("%w: %s %q: printable ASCII without '/' or spaces only", ErrInvalid, what, s)
		}
	}
	return nil
}

func validMember(m *wire.Member) error {
	if m == nil {
		return fmt.Errorf("%w: no member", ErrInvalid)
	}
	if err := validName("member id", m.ID); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(m.Addr)
	if err != nil || host == "" || port == "" || port == "0" {
		return fmt.Errorf("%w: member %q address %q: want host:port", ErrInvalid, m.ID, m.Addr)
	}
	if m.Weight < 1 || m.Weight > ring.MaxWeight {
		return fmt.Errorf("%w: member %q weight %d not in 1..%d", ErrInvalid, m.ID, m.Weight, ring.MaxWeight)
	}
	return nil
}

// Handle answers one request. It never panics on input and bounds its etcd work by the
// configured call timeout (and ctx).
func (s *Service) Handle(ctx context.Context, req *wire.MdsRequest) *wire.MdsResponse {
	start := time.Now()
	op := req.Op.String()
	if req.Op == fb.MdsOpListTopology && req.WaitMS > 0 {
		op = "WaitTopology" // a long poll bounds its own etcd reads; its wait is not latency
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.CallTimeout)
		defer cancel()
	}
	resp, err := s.handle(ctx, req)
	if resp == nil {
		resp = &wire.MdsResponse{}
	}
	switch {
	case err == nil:
		resp.Status = fb.StatusOk
	case errors.Is(err, ErrInvalid):
		resp.Status, resp.Error = fb.StatusInvalid, err.Error()
	case errors.Is(err, ErrNotFound):
		resp.Status, resp.Error = fb.StatusNotFound, err.Error()
	default:
		resp.Status, resp.Error = fb.StatusIOError, err.Error()
		s.cfg.Logger.Warn("mds request failed", "op", req.Op.String(), "group", req.Group, "err", err)
	}
	s.cfg.Metrics.request(op, resp.Status, time.Since(start))
	return resp
}

func (s *Service) handle(ctx context.Context, req *wire.MdsRequest) (*wire.MdsResponse, error) {
	group := req.Group
	if group == "" {
		group = DefaultGroup
	}
	if err := validName("group", group); err != nil {
		return nil, err
	}
	ttlMS := uint32(s.cfg.LeaseTTL / time.Millisecond)
	switch req.Op {
	case fb.MdsOpRegisterMember, fb.MdsOpHeartbeatMember:
		if err := validMember(req.Member); err != nil {
			return nil, err
		}
		key := MembersPrefix(group) + req.Member.ID
		val := wire.EncodeMember(req.Member)
		if req.Op == fb.MdsOpRegisterMember {
			if err := s.cfg.Store.Put(ctx, key, val, s.cfg.LeaseTTL); err != nil {
				return nil, fmt.Errorf("register member %s/%s: %w", group, req.Member.ID, err)
			}
			s.cfg.Logger.Info("member registered", "group", group, "id", req.Member.ID, "addr", req.Member.Addr, "weight", req.Member.Weight)
		} else if err := s.cfg.Store.KeepAlive(ctx, key, val); err != nil {
			return nil, fmt.Errorf("heartbeat member %s/%s: %w", group, req.Member.ID, err)
		}
		return &wire.MdsResponse{LeaseTTLMS: ttlMS}, nil
	case fb.MdsOpDeregisterMember:
		if req.Member == nil {
			return nil, fmt.Errorf("%w: no member", ErrInvalid)
		}
		if err := validName("member id", req.Member.ID); err != nil {
			return nil, err
		}
		if err := s.cfg.Store.Delete(ctx, MembersPrefix(group)+req.Member.ID); err != nil {
			return nil, fmt.Errorf("deregister member %s/%s: %w", group, req.Member.ID, err)
		}
		s.cfg.Logger.Info("member deregistered", "group", group, "id", req.Member.ID)
		return &wire.MdsResponse{}, nil
	case fb.MdsOpListTopology:
		if req.WaitMS > 0 {
			return s.longPoll(ctx, group, req.KnownTopologyEpoch, time.Duration(req.WaitMS)*time.Millisecond)
		}
		topo, err := s.Topology(ctx, group)
		if err != nil {
			return nil, err
		}
		return &wire.MdsResponse{LeaseTTLMS: ttlMS, Topology: topo}, nil
	case fb.MdsOpRegisterClient, fb.MdsOpHeartbeatClient, fb.MdsOpDeregisterClient:
		if req.Client == nil {
			return nil, fmt.Errorf("%w: no client", ErrInvalid)
		}
		if err := validName("client id", req.Client.ID); err != nil {
			return nil, err
		}
		key := ClientsPrefix(group) + req.Client.ID
		ttlMS := uint32(s.cfg.ClientLeaseTTL / time.Millisecond)
		var err error
		switch req.Op {
		case fb.MdsOpRegisterClient:
			c := *req.Client
			if c.RegisteredUnixMS == 0 {
				c.RegisteredUnixMS = uint64(s.cfg.Now().UnixMilli())
			}
			err = s.cfg.Store.Put(ctx, key, wire.EncodeClientInfo(&c), s.cfg.ClientLeaseTTL)
		case fb.MdsOpHeartbeatClient:
			err = s.cfg.Store.KeepAlive(ctx, key, nil)
		default:
			err = s.cfg.Store.Delete(ctx, key)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", req.Op, group, req.Client.ID, err)
		}
		return &wire.MdsResponse{LeaseTTLMS: ttlMS}, nil
	case fb.MdsOpListClients:
		clients, err := s.Clients(ctx, group)
		if err != nil {
			return nil, err
		}
		if clients == nil {
			clients = []wire.ClientInfo{}
		}
		return &wire.MdsResponse{LeaseTTLMS: ttlMS, Clients: clients}, nil
	default:
		return nil, fmt.Errorf("%w: op %d", ErrInvalid, req.Op)
	}
}

// Topology reads a group's members and computes both epochs.
func (s *Service) Topology(ctx context.Context, group string) (*wire.Topology, error) {
	kvs, err := s.cfg.Store.List(ctx, MembersPrefix(group), min(s.cfg.MaxList, wire.MaxMdsMembers))
	if err != nil {
		return nil, fmt.Errorf("list members of %s: %w", group, err)
	}
	return s.buildTopology(group, kvs), nil
}

// buildTopology decodes a listing of a group's members (skipping bad records) into a
// topology with both epochs.
func (s *Service) buildTopology(group string, kvs []KV) *wire.Topology {
	members := make([]wire.Member, 0, len(kvs))
	for _, kv := range kvs {
		m, err := wire.DecodeMember(kv.Value)
		if err != nil || validMember(&m) != nil || m.ID != strings.TrimPrefix(kv.Key, MembersPrefix(group)) {
			s.cfg.Logger.Warn("skipping undecodable member record", "key", kv.Key, "err", err)
			s.cfg.Metrics.badRecord()
			continue
		}
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].ID < members[j].ID })
	me, te := Epochs(members)
	s.cfg.Metrics.groupMembers(group, len(members))
	s.cfg.Metrics.groupEpoch(group, me)
	return &wire.Topology{MembersEpoch: me, TopologyEpoch: te, Members: members}
}

// Clients reads a group's registered clients.
func (s *Service) Clients(ctx context.Context, group string) ([]wire.ClientInfo, error) {
	kvs, err := s.cfg.Store.List(ctx, ClientsPrefix(group), s.cfg.MaxList)
	if err != nil {
		return nil, fmt.Errorf("list clients of %s: %w", group, err)
	}
	var out []wire.ClientInfo
	for _, kv := range kvs {
		c, err := wire.DecodeClientInfo(kv.Value)
		if err != nil {
			s.cfg.Logger.Warn("skipping undecodable client record", "key", kv.Key, "err", err)
			s.cfg.Metrics.badRecord()
			continue
		}
		out = append(out, c)
	}
	s.cfg.Metrics.groupClients(group, len(out))
	return out, nil
}

// Epochs hashes members (sorted by id) into MembersEpoch (placement content: id, address,
// weight, eligibility) and TopologyEpoch (placement plus version, config and every field of
// every rail: port and physical state, query, port, NUMA node, tier, health, generation, with
// config sorted by key and rails by device name). Neither is ever 0 (0 means "no view").
func Epochs(members []wire.Member) (membersEpoch, topologyEpoch uint64) {
	ms := append([]wire.Member(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	pe, te := sha256.New(), sha256.New()
	var b []byte
	putStr := func(s string) {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, m := range ms {
		b = b[:0]
		putStr(m.ID)
		putStr(m.Addr)
		b = binary.LittleEndian.AppendUint32(b, m.Weight)
		if m.Eligible {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		pe.Write(b)
		te.Write(b)
		b = b[:0]
		putStr(m.Version)
		cfg := append([]wire.KV(nil), m.Config...)
		sort.Slice(cfg, func(i, j int) bool { return cfg[i].Key < cfg[j].Key })
		b = binary.LittleEndian.AppendUint64(b, uint64(len(cfg)))
		for _, kv := range cfg {
			putStr(kv.Key)
			putStr(kv.Value)
		}
		rails := append([]wire.Rail(nil), m.Rails...)
		sort.Slice(rails, func(i, j int) bool { return rails[i].Device < rails[j].Device })
		b = binary.LittleEndian.AppendUint64(b, uint64(len(rails)))
		for _, r := range rails {
			putStr(r.Device)
			b = append(b, r.PortState, r.PhysState)
			if r.QueryOK {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
			b = append(b, r.Port, r.Tier, byte(r.Health))
			b = binary.LittleEndian.AppendUint16(b, uint16(r.NUMANode))
			b = binary.LittleEndian.AppendUint32(b, r.Generation)
		}
		te.Write(b)
	}
	membersEpoch = binary.LittleEndian.Uint64(pe.Sum(nil))
	topologyEpoch = binary.LittleEndian.Uint64(te.Sum(nil))
	return max(membersEpoch, 1), max(topologyEpoch, 1)
}
