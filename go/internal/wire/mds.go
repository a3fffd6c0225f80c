package wire

import (
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// MDS control plane. A call is one frame each way on the MDS TCP port:
//
//	request   RequestHeader(64, op=Mds, payload_len=N)  MdsRequest table (N bytes, N <= MaxControl)
//	response  ResponseHeader(32, op=Mds, status=Ok)      MdsResponse table (payload_len bytes)
//
// The prefix status is about the frame; the call's own outcome is MdsResponse.status
// (Ok, NotFound = "not registered: register again", Invalid, IOError = "etcd unavailable").
// A connection may carry any number of calls, one at a time.

// Structural limits of the MDS messages; a table that breaks one is ErrLimit.
const (
	MaxMdsIDLen      = 256      // member / client / group id bytes
	MaxMdsStringLen  = 4096     // any other string
	MaxMdsKVs        = 64       // config / client_info entries
	MaxMdsRails      = 64       // rails per member
	MaxMdsMembers    = 4096     // members in one topology
	MaxMdsClients    = 65536    // clients in one list
	MaxMdsResponse   = 64 << 20 // largest MdsResponse payload a reader accepts
	TopologyMagicHLT = 0x31544C48
)

// KV is one key=value pair (member config, client info).
type KV struct{ Key, Value string }

// Rail is the health of one RDMA rail of a member.
type Rail struct {
	Device    string
	PortState uint8
	PhysState uint8
	QueryOK   bool
	Port      uint8 // 1-based port number; 0 = unknown
	NUMANode  int16 // -1 = unknown (the schema default)
	Tier      uint8 // selection tier (0 = preferred)
	// Generation bumps whenever the rail's published health changes (per server run).
	Generation uint32
	Health     fb.RailHealth // Unknown from writers that predate it
}

// Usable reports whether peers may use the rail: Healthy, or (for a writer that predates
// Health) queried with its port ACTIVE.
func (r Rail) Usable() bool {
	if r.Health != fb.RailHealthUnknown {
		return r.Health == fb.RailHealthHealthy
	}
	return r.QueryOK && r.PortState == 4 // IB_PORT_ACTIVE
}

// State is the rail's health in one lower-case word: "healthy", "down", "quarantined", or
// for a writer that predates Health, "up" / "down" / "unqueried" judged from the port.
func (r Rail) State() string {
	switch r.Health {
	case fb.RailHealthHealthy:
		return "healthy"
	case fb.RailHealthDown:
		return "down"
	case fb.RailHealthQuarantined:
		return "quarantined"
	case fb.RailHealthUnknown:
		switch {
		case !r.QueryOK:
			return "unqueried"
		case r.PortState == 4:
			return "up"
		default:
			return "down"
		}
	}
	return "unknown(" + r.Health.String() + ")"
}

// Member is one cache node as registered with the MDS.
type Member struct {
	ID       string
	Addr     string
	Weight   uint32
	Eligible bool
	Version  string
	Config   []KV
	Rails    []Rail
}

// Topology is the HLT1 view the MDS serves.
type Topology struct {
	MembersEpoch  uint64
	TopologyEpoch uint64
	Members       []Member
}

// ClientInfo is a registered cache consumer (never part of the ring).
type ClientInfo struct {
	ID               string
	Info             []KV
	PID              uint64
	Hostname         string
	RegisteredUnixMS uint64
}

// MdsRequest is one MDS call.
type MdsRequest struct {
	Op                fb.MdsOp
	Group             string
	Member            *Member
	Client            *ClientInfo
	KnownMembersEpoch uint64
	Token             string // tenant token; checked by an MDS run with --auth-tokens
	// WaitMS > 0 makes ListTopology a long poll: the MDS holds the answer up to WaitMS until
	// the group's TopologyEpoch differs from KnownTopologyEpoch.
	WaitMS             uint32
	KnownTopologyEpoch uint64
}

// MdsResponse is the MDS's answer.
type MdsResponse struct {
	Status     fb.Status
	Error      string
	LeaseTTLMS uint32
	Topology   *Topology
	Clients    []ClientInfo
	// WaitMS is the long-poll wait the MDS honoured (0: it answered at once and does not
	// long-poll). A long poll that ended without a change has no Topology.
	WaitMS uint32
}

func buildKVs(b *flatbuffers.Builder, kvs []KV) flatbuffers.UOffsetT {
	offs := make([]flatbuffers.UOffsetT, len(kvs))
	for i, kv := range kvs {
		k, v := b.CreateString(kv.Key), b.CreateString(kv.Value)
		fb.KeyValueStart(b)
		fb.KeyValueAddKey(b, k)
		fb.KeyValueAddValue(b, v)
		offs[i] = fb.KeyValueEnd(b)
	}
	return vector(b, offs)
}

func vector(b *flatbuffers.Builder, offs []flatbuffers.UOffsetT) flatbuffers.UOffsetT {
	b.StartVector(4, len(offs), 4)
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	return b.EndVector(len(offs))
}

func buildMember(b *flatbuffers.Builder, m *Member) flatbuffers.UOffsetT {
	id, addr, ver := b.CreateString(m.ID), b.CreateString(m.Addr), b.CreateString(m.Version)
	cfg := buildKVs(b, m.Config)
	rails := make([]flatbuffers.UOffsetT, len(m.Rails))
	for i, r := range m.Rails {
		d := b.CreateString(r.Device)
		fb.RailStart(b)
		fb.RailAddDevice(b, d)
		fb.RailAddPortState(b, r.PortState)
		fb.RailAddPhysState(b, r.PhysState)
		fb.RailAddQueryOk(b, r.QueryOK)
		fb.RailAddPort(b, r.Port)
		fb.RailAddNumaNode(b, r.NUMANode)
		fb.RailAddTier(b, r.Tier)
		fb.RailAddGeneration(b, r.Generation)
		fb.RailAddHealth(b, r.Health)
		rails[i] = fb.RailEnd(b)
	}
	rv := vector(b, rails)
	fb.MemberStart(b)
	fb.MemberAddId(b, id)
	fb.MemberAddAddress(b, addr)
	// Written explicitly (the schema defaults are 1 and true) so that readers built
	// against other defaults see the same value.
	b.PrependUint32(m.Weight)
	b.Slot(2)
	b.PrependBool(m.Eligible)
	b.Slot(3)
	fb.MemberAddVersion(b, ver)
	fb.MemberAddConfig(b, cfg)
	fb.MemberAddRails(b, rv)
	return fb.MemberEnd(b)
}

func buildClient(b *flatbuffers.Builder, c *ClientInfo) flatbuffers.UOffsetT {
	id, host := b.CreateString(c.ID), b.CreateString(c.Hostname)
	info := buildKVs(b, c.Info)
	fb.ClientInfoStart(b)
	fb.ClientInfoAddId(b, id)
	fb.ClientInfoAddInfo(b, info)
	fb.ClientInfoAddPid(b, c.PID)
	fb.ClientInfoAddHostname(b, host)
	fb.ClientInfoAddRegisteredUnixMs(b, c.RegisteredUnixMS)
	return fb.ClientInfoEnd(b)
}

func buildTopology(b *flatbuffers.Builder, t *Topology) flatbuffers.UOffsetT {
	ms := make([]flatbuffers.UOffsetT, len(t.Members))
	for i := range t.Members {
		ms[i] = buildMember(b, &t.Members[i])
	}
	mv := vector(b, ms)
	fb.TopologyStart(b)
	b.PrependUint32(TopologyMagicHLT)
	b.Slot(0)
	fb.TopologyAddMembersEpoch(b, t.MembersEpoch)
	fb.TopologyAddTopologyEpoch(b, t.TopologyEpoch)
	fb.TopologyAddMembers(b, mv)
	return fb.TopologyEnd(b)
}

// EncodeMdsRequest builds an MdsRequest table.
func EncodeMdsRequest(r *MdsRequest) []byte {
	b := flatbuffers.NewBuilder(256)
	g := b.CreateString(r.Group)
	var m, c, tok flatbuffers.UOffsetT
	if r.Token != "" {
		tok = b.CreateString(r.Token)
	}
	if r.Member != nil {
		m = buildMember(b, r.Member)
	}
	if r.Client != nil {
		c = buildClient(b, r.Client)
	}
	fb.MdsRequestStart(b)
	fb.MdsRequestAddOp(b, r.Op)
	fb.MdsRequestAddGroup(b, g)
	if tok != 0 {
		fb.MdsRequestAddToken(b, tok)
	}
	if r.Member != nil {
		fb.MdsRequestAddMember(b, m)
	}
	if r.Client != nil {
		fb.MdsRequestAddClient(b, c)
	}
	fb.MdsRequestAddKnownMembersEpoch(b, r.KnownMembersEpoch)
	fb.MdsRequestAddWaitMs(b, r.WaitMS)
	fb.MdsRequestAddKnownTopologyEpoch(b, r.KnownTopologyEpoch)
	b.Finish(fb.MdsRequestEnd(b))
	return b.FinishedBytes()
}

// EncodeMdsResponse builds an MdsResponse table.
func EncodeMdsResponse(r *MdsResponse) []byte {
	b := flatbuffers.NewBuilder(1024)
	e := b.CreateString(r.Error)
	var topo, cv flatbuffers.UOffsetT
	if r.Topology != nil {
		topo = buildTopology(b, r.Topology)
	}
	if r.Clients != nil {
		offs := make([]flatbuffers.UOffsetT, len(r.Clients))
		for i := range r.Clients {
			offs[i] = buildClient(b, &r.Clients[i])
		}
		cv = vector(b, offs)
	}
	fb.MdsResponseStart(b)
	fb.MdsResponseAddStatus(b, byte(r.Status))
	fb.MdsResponseAddError(b, e)
	fb.MdsResponseAddLeaseTtlMs(b, r.LeaseTTLMS)
	fb.MdsResponseAddWaitMs(b, r.WaitMS)
	if r.Topology != nil {
		fb.MdsResponseAddTopology(b, topo)
	}
	if r.Clients != nil {
		fb.MdsResponseAddClients(b, cv)
	}
	b.Finish(fb.MdsResponseEnd(b))
	return b.FinishedBytes()
}

// EncodeMember builds a standalone Member table (the value the MDS stores in etcd).
func EncodeMember(m *Member) []byte {
	b := flatbuffers.NewBuilder(256)
	b.Finish(buildMember(b, m))
	return b.FinishedBytes()
}

// EncodeClientInfo builds a standalone ClientInfo table.
func EncodeClientInfo(c *ClientInfo) []byte {
	b := flatbuffers.NewBuilder(256)
	b.Finish(buildClient(b, c))
	return b.FinishedBytes()
}

// decoding helpers: every length is checked against the buffer before a loop runs, and
// every string against a limit, so hostile counts cannot make a decoder spin or allocate.

type limitErr struct{ msg string }

func bounded(what string, n, max, bufLen int) {
	if n > max || n > bufLen/4 {
		panic(limitErr{fmt.Sprintf("%s count %d exceeds limit %d", what, n, max)})
	}
}

func str(what string, b []byte, max int) string {
	if len(b) > max {
		panic(limitErr{fmt.Sprintf("%s length %d exceeds %d", what, len(b), max)})
	}
	return string(b)
}

func readKVs(n int, get func(*fb.KeyValue, int) bool, bufLen int) []KV {
	bounded("key/value", n, MaxMdsKVs, bufLen)
	if n == 0 {
		return nil
	}
	out := make([]KV, 0, n)
	var kv fb.KeyValue
	for i := 0; i < n; i++ {
		if get(&kv, i) {
			out = append(out, KV{Key: str("key", kv.Key(), MaxMdsStringLen), Value: str("value", kv.Value(), MaxMdsStringLen)})
		}
	}
	return out
}

func readMember(t *fb.Member, bufLen int) Member {
	m := Member{
		ID: str("member id", t.Id(), MaxMdsIDLen), Addr: str("address", t.Address(), MaxMdsStringLen),
		Weight: t.Weight(), Eligible: t.Eligible(), Version: str("version", t.Version(), MaxMdsStringLen),
	}
	m.Config = readKVs(t.ConfigLength(), t.Config, bufLen)
	n := t.RailsLength()
	bounded("rail", n, MaxMdsRails, bufLen)
	var r fb.Rail
	for i := 0; i < n; i++ {
		if t.Rails(&r, i) {
			m.Rails = append(m.Rails, Rail{Device: str("rail device", r.Device(), MaxMdsStringLen), PortState: r.PortState(), PhysState: r.PhysState(), QueryOK: r.QueryOk(),
				Port: r.Port(), NUMANode: r.NumaNode(), Tier: r.Tier(), Generation: r.Generation(), Health: r.Health()})
		}
	}
	return m
}

func readClient(t *fb.ClientInfo, bufLen int) ClientInfo {
	c := ClientInfo{ID: str("client id", t.Id(), MaxMdsIDLen), PID: t.Pid(), Hostname: str("hostname", t.Hostname(), MaxMdsStringLen), RegisteredUnixMS: t.RegisteredUnixMs()}
	c.Info = readKVs(t.InfoLength(), t.Info, bufLen)
	return c
}

func readTopology(t *fb.Topology, bufLen int) Topology {
	if m := t.Magic(); m != TopologyMagicHLT {
		panic(limitErr{fmt.Sprintf("topology magic %#x, want HLT1", m)})
	}
	topo := Topology{MembersEpoch: t.MembersEpoch(), TopologyEpoch: t.TopologyEpoch()}
	n := t.MembersLength()
	bounded("member", n, MaxMdsMembers, bufLen)
	var m fb.Member
	for i := 0; i < n; i++ {
		if t.Members(&m, i) {
			topo.Members = append(topo.Members, readMember(&m, bufLen))
		}
	}
	return topo
}

// safeMds runs decode under safeTable and maps a limit panic to ErrLimit.
func safeMds(what string, buf []byte, decode func(buf []byte)) error {
	var lim *limitErr
	err := safeTable(buf, func(buf []byte) {
		defer func() {
			if r := recover(); r != nil {
				if l, ok := r.(limitErr); ok {
					lim = &l
					return
				}
				panic(r)
			}
		}()
		decode(buf)
	})
	if err != nil {
		return fmt.Errorf("wire: %s: %w", what, err)
	}
	if lim != nil {
		return fmt.Errorf("wire: %s: %w: %s", what, ErrLimit, lim.msg)
	}
	return nil
}

// DecodeMdsRequest parses an MdsRequest table; malformed input is an error, never a panic.
func DecodeMdsRequest(buf []byte) (r MdsRequest, err error) {
	err = safeMds("mds request", buf, func(buf []byte) {
		t := fb.GetRootAsMdsRequest(buf, 0)
		r = MdsRequest{Op: t.Op(), Group: str("group", t.Group(), MaxMdsIDLen), KnownMembersEpoch: t.KnownMembersEpoch(),
			Token: str("token", t.Token(), MaxTokenLen), WaitMS: t.WaitMs(), KnownTopologyEpoch: t.KnownTopologyEpoch()}
		var m fb.Member
		if t.Member(&m) != nil {
			mm := readMember(&m, len(buf))
			r.Member = &mm
		}
		var c fb.ClientInfo
		if t.Client(&c) != nil {
			cc := readClient(&c, len(buf))
			r.Client = &cc
		}
	})
	if err != nil {
		return MdsRequest{}, err
	}
	if _, ok := fb.EnumNamesMdsOp[r.Op]; !ok || r.Op == fb.MdsOpInvalid {
		return MdsRequest{}, fmt.Errorf("wire: mds request: %w: op %d", ErrUnknownOp, r.Op)
	}
	return r, nil
}

// DecodeMdsResponse parses an MdsResponse table.
func DecodeMdsResponse(buf []byte) (r MdsResponse, err error) {
	err = safeMds("mds response", buf, func(buf []byte) {
		t := fb.GetRootAsMdsResponse(buf, 0)
		r = MdsResponse{Status: fb.Status(t.Status()), Error: str("error", t.Error(), MaxMdsStringLen), LeaseTTLMS: t.LeaseTtlMs(), WaitMS: t.WaitMs()}
		var topo fb.Topology
		if t.Topology(&topo) != nil {
			tt := readTopology(&topo, len(buf))
			r.Topology = &tt
		}
		n := t.ClientsLength()
		bounded("client", n, MaxMdsClients, len(buf))
		if n > 0 {
			r.Clients = make([]ClientInfo, 0, n)
		}
		var c fb.ClientInfo
		for i := 0; i < n; i++ {
			if t.Clients(&c, i) {
				r.Clients = append(r.Clients, readClient(&c, len(buf)))
			}
		}
	})
	if err != nil {
		return MdsResponse{}, err
	}
	if r.Status > MaxStatus {
		return MdsResponse{}, fmt.Errorf("wire: mds response: %w: status %d", ErrMalformed, r.Status)
	}
	return r, nil
}

// DecodeMember parses a standalone Member table.
func DecodeMember(buf []byte) (m Member, err error) {
	err = safeMds("member", buf, func(buf []byte) { m = readMember(fb.GetRootAsMember(buf, 0), len(buf)) })
	return m, err
}

// DecodeClientInfo parses a standalone ClientInfo table.
func DecodeClientInfo(buf []byte) (c ClientInfo, err error) {
	err = safeMds("client info", buf, func(buf []byte) { c = readClient(fb.GetRootAsClientInfo(buf, 0), len(buf)) })
	return c, err
}

// CheckMds validates the prefix of an MDS request frame against the limits.
func (l Limits) CheckMds(r *Request) error {
	switch {
	case r.Op != fb.OpMds:
		return &FrameError{Err: fmt.Errorf("%w: op %d on the MDS port", ErrUnknownOp, r.Op), Resync: r.PayloadLen <= l.MaxControl}
	case r.PayloadLen == 0 || r.PayloadLen > l.MaxControl:
		return &FrameError{Err: fmt.Errorf("%w: mds payload %d not in 1..%d", ErrLimit, r.PayloadLen, l.MaxControl), Resync: false}
	case r.Flags != 0 || r.Count != 0:
		return &FrameError{Err: fmt.Errorf("%w: mds frame with flags %#x count %d", ErrMalformed, r.Flags, r.Count), Resync: true}
	}
	return nil
}
