package cabi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
	"github.com/dfkv/dfkv/go/internal/version"
	"github.com/dfkv/dfkv/go/ring"
)

// ABI constants mirrored from dfkv.h.
const (
	ABIVersion          = 2
	OptionsSize         = 88 // sizeof(dfkv_client_options_v2) on LP64
	FlagRegisterWithMDS = 1 << 0
	FlagRDMA            = 1 << 1 // DFKV_CLIENT_OPT_RDMA, or DFKV_RDMA=1
	knownFlags          = FlagRegisterWithMDS | FlagRDMA
)

// Options is dfkv_client_options_v2 after the cgo layer copied it out of C memory.
type Options struct {
	StructSize        uint32
	ABIVersion        uint32
	Members           string
	Namespace         []byte
	BatchConcurrency  uint64
	MDSEndpoints      string
	MDSGroup          string
	MDSPollMS         int32
	Flags             uint32
	ClientID          string
	ClientInfo        string
	ClientHeartbeatMS int32
	Reserved0         uint32
}

// Validate applies dfkv_open_v2's refusal rules.
func (o *Options) Validate() error {
	switch {
	case o.StructSize < OptionsSize:
		return fmt.Errorf("struct_size %d < %d", o.StructSize, OptionsSize)
	case o.ABIVersion != ABIVersion:
		return fmt.Errorf("abi_version %d, want %d", o.ABIVersion, ABIVersion)
	case o.Flags&^knownFlags != 0:
		return fmt.Errorf("unknown flags %#x", o.Flags&^knownFlags)
	case o.Reserved0 != 0:
		return errors.New("reserved0 must be 0")
	case strings.TrimSpace(o.Members) == "" && strings.TrimSpace(o.MDSEndpoints) == "":
		return errors.New("neither members nor mds_endpoints")
	case o.BatchConcurrency > 4096:
		return fmt.Errorf("batch_concurrency %d > 4096", o.BatchConcurrency)
	}
	return nil
}

// MembershipFactory builds a membership source for MDS discovery. It is nil until the MDS
// client is linked in; opening with only mds_endpoints then fails cleanly.
var MembershipFactory func(o *Options) (client.Membership, error)

// Handle is one open client.
type Handle struct {
	c      *client.Client
	onCool atomic.Pointer[func(addr string, until time.Time)] // SetOnPeerCooldown
}

// SetOnPeerCooldown sets what runs each time one of the client's peers starts a cool-down
// (client.Options.OnPeerCooldown); the library's GET fast path drops its sockets then.
func (h *Handle) SetOnPeerCooldown(fn func(addr string, until time.Time)) { h.onCool.Store(&fn) }

func (h *Handle) peerCooled(addr string, until time.Time) {
	if fn := h.onCool.Load(); fn != nil && *fn != nil {
		(*fn)(addr, until)
	}
}

var (
	handles sync.Map // uint64 -> *Handle
	nextID  atomic.Uint64
)

// LastError records why the most recent Open failed, for diagnostics (DFKV_LOG).
var lastErr atomic.Pointer[string]

// LastError returns the most recent Open failure, or "".
func LastError() string {
	if p := lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Open validates options and registers a client; it returns 0 on failure.
func Open(o *Options) (id uint64) {
	defer func() {
		if r := recover(); r != nil {
			setErr(fmt.Errorf("panic: %v", r))
			id = 0
		}
	}()
	h, err := open(o)
	if err != nil {
		setErr(err)
		return 0
	}
	id = nextID.Add(1) + 0x10000 // never 0, never a small integer that looks like an errno
	handles.Store(id, h)
	return id
}

func setErr(err error) {
	s := err.Error()
	lastErr.Store(&s)
	if os.Getenv("DFKV_LOG") != "" {
		fmt.Fprintln(os.Stderr, "dfkv_open_v2:", s)
	}
}

func open(o *Options) (*Handle, error) {
	if o == nil {
		return nil, errors.New("NULL options")
	}
	syncEnv() // DFKV_* as the process's environment says now, not at load (env.go)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var ms client.Membership
	var err error
	switch {
	case strings.TrimSpace(o.Members) != "":
		var members []client.Member
		var points int
		if members, err = client.ParseMembers(o.Members); err == nil {
			if points, err = ringPoints(); err == nil {
				ms, err = client.NewStatic(members, ring.WithPointsPerWeight(points))
			}
		}
	case MembershipFactory != nil:
		ms, err = MembershipFactory(o)
	default:
		err = errors.New("MDS discovery is not available in this build")
	}
	if err != nil {
		return nil, err
	}
	copts := client.Options{
		Membership: ms, Namespace: o.Namespace, Tenant: []byte(os.Getenv("DFKV_TENANT")),
		BatchConcurrency: int(o.BatchConcurrency),
		// C callers enter from their own threads: blocking I/O on that thread beats a
		// netpoller handoff per partial read (docs/BENCHMARKS.md, "C ABI").
		// DFKV_BLOCKING_IO=0 keeps the netpoller path (for side-by-side measurements).
		BlockingIO: os.Getenv("DFKV_BLOCKING_IO") != "0",
	}
	if os.Getenv("DFKV_LOG") != "" { // the client's own lines (RDMA fallbacks, rail breaks) on stderr
		copts.Logger = mdsLogger()
	}
	if o.Flags&FlagRDMA != 0 || os.Getenv("DFKV_RDMA") == "1" {
		// MRCacheBytes < 0: C and Python callers' memory is not the Go runtime's, so a cached
		// registration could outlive the mapping it pinned; transient MRs end with their op.
		copts.RDMA = &client.RDMAOptions{Provider: os.Getenv("DFKV_RDMA_PROVIDER"),
			Devices: splitList(os.Getenv("DFKV_RDMA_DEV"), ","), Primary: strings.TrimSpace(os.Getenv("DFKV_RDMA_PRIMARY_DEV")),
			Tiers: parseTiers(os.Getenv("DFKV_RDMA_TIERS")), ForceV1: os.Getenv("DFKV_RDMA_PROTOCOL") == "1", MRCacheBytes: -1}
		if copts.RDMA.Provider == "soft" { // the test and demo NIC: its device count and fault file
			n, err := soft.ParseDevices(os.Getenv(soft.DevicesEnv))
			if err != nil {
				ms.Close()
				return nil, err
			}
			copts.RDMA.SoftDevices, copts.RDMA.SoftFaultFile = n, os.Getenv(soft.FaultsEnv)
			if copts.RDMA.SoftNUMANodes, err = soft.ParseNUMANodes(os.Getenv(soft.NUMAEnv)); err != nil {
				ms.Close()
				return nil, err
			}
		}
		if err := applyRDMAEnv(copts.RDMA); err != nil {
			ms.Close()
			return nil, err
		}
	}
	if err := applyTimeoutEnv(&copts); err != nil {
		ms.Close()
		return nil, err
	}
	if copts.TLS, copts.Token, err = securityEnv(); err != nil {
		ms.Close()
		return nil, err
	}
	h := &Handle{}
	copts.OnPeerCooldown = h.peerCooled
	c, err := client.New(copts)
	if err != nil {
		ms.Close()
		return nil, err
	}
	h.c = c
	return h, nil
}

// Lookup returns the handle for id, or nil (closed or never opened).
func Lookup(id uint64) *Handle {
	if v, ok := handles.Load(id); ok {
		return v.(*Handle)
	}
	return nil
}

// Close closes and forgets a handle; unknown ids are ignored.
func Close(id uint64) {
	if v, ok := handles.LoadAndDelete(id); ok {
		_ = v.(*Handle).c.Close()
	}
}

// Client exposes the Go client (for tests).
func (h *Handle) Client() *client.Client { return h.c }

// Every Handle method returns the C return code and, when that code means failure (a miss
// included), the reason, which the export layer keeps for dfkv_last_error.

var (
	errEmptyValue  = errors.New("dfkv: zero-length value")
	errEmptyBuffer = errors.New("dfkv: zero-length buffer")
	errArgs        = errors.New("dfkv: array lengths disagree")
)

// Put: 0 ok, -1 fail (zero-length values rejected).
func (h *Handle) Put(key, value []byte) (int, error) {
	if len(value) == 0 {
		return -1, errEmptyValue
	}
	if err := h.c.Put(context.Background(), key, value); err != nil {
		return -1, err
	}
	return 0, nil
}

// Get: 1 when the stored value is exactly len(buf) bytes.
func (h *Handle) Get(key, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, errEmptyBuffer
	}
	if err := h.c.Get(context.Background(), key, buf); err != nil {
		return 0, err
	}
	return 1, nil
}

// GetAuto: 1 when the value fits buf; its length in the second result.
func (h *Handle) GetAuto(key, buf []byte) (int, uint64, error) {
	if len(buf) == 0 {
		return 0, 0, errEmptyBuffer
	}
	n, err := h.c.GetAuto(context.Background(), key, buf)
	if err != nil {
		return 0, 0, err
	}
	return 1, uint64(n), nil
}

// Exist: 1 when present.
func (h *Handle) Exist(key []byte) (int, error) {
	if _, err := h.c.Exist(context.Background(), key); err != nil {
		return 0, err
	}
	return 1, nil
}

// Remove: 1 when the owner confirmed the key is gone, removed now or already absent (the
// original dfkv ABI's rule); 0 when that is unknown (timeout, unavailable, ...).
func (h *Handle) Remove(key []byte) (int, error) {
	if err := h.c.Remove(context.Background(), key); err != nil && !errors.Is(err, client.ErrNotFound) {
		return 0, err
	}
	return 1, nil
}

// Tag attaches engine identities (KV events) and returns how many were attached.
func (h *Handle) Tag(tags []client.Tag) (int, error) {
	n, err := h.c.Tag(context.Background(), tags)
	if err != nil {
		return -1, err
	}
	return n, nil
}

// results copies per-item outcomes; the error is the first failed item's, for
// dfkv_last_error (the call itself succeeded).
func results(items []client.Item, outOK []int32, outLens []uint64, absentOK bool) error {
	var first error
	for i := range items {
		err := items[i].Err
		if absentOK && errors.Is(err, client.ErrNotFound) {
			err = nil
		}
		if err == nil {
			outOK[i] = 1
			if outLens != nil {
				outLens[i] = uint64(items[i].N)
			}
		} else if first == nil {
			first = fmt.Errorf("item %d: %w", i, err)
		}
	}
	return first
}

// BatchPut stores values[i] under keys[i]; per-item 1/0 in outOK. Returns 0, or -1 when the
// arguments are unusable.
func (h *Handle) BatchPut(keys, values [][]byte, outOK []int32) (int, error) {
	clear(outOK)
	if len(values) != len(keys) || len(outOK) != len(keys) {
		return -1, errArgs
	}
	items := make([]client.Item, len(keys))
	for i := range items {
		items[i] = client.Item{Key: keys[i], Value: values[i]}
	}
	if err := h.c.BatchPut(context.Background(), items); err != nil {
		return -1, err
	}
	return 0, results(items, outOK, nil, false)
}

// BatchGet reads exact-size values into bufs.
func (h *Handle) BatchGet(keys, bufs [][]byte, outOK []int32) (int, error) {
	return h.batchGet(keys, bufs, nil, outOK, nil, client.Exact)
}

// BatchGetAuto reads values of at most len(bufs[i]) bytes and reports their lengths.
func (h *Handle) BatchGetAuto(keys, bufs [][]byte, outOK []int32, outLens []uint64) (int, error) {
	return h.batchGet(keys, bufs, nil, outOK, outLens, client.Auto)
}

// BatchGetAutoSG scatters each value across segs[i] in order.
func (h *Handle) BatchGetAutoSG(keys [][]byte, segs [][][]byte, outOK []int32, outLens []uint64) (int, error) {
	return h.batchGet(keys, nil, segs, outOK, outLens, client.Auto)
}

func (h *Handle) batchGet(keys, bufs [][]byte, segs [][][]byte, outOK []int32, outLens []uint64, mode client.GetMode) (int, error) {
	clear(outOK)
	clear(outLens)
	if len(outOK) != len(keys) || (outLens != nil && len(outLens) != len(keys)) ||
		(bufs != nil && len(bufs) != len(keys)) || (segs != nil && len(segs) != len(keys)) {
		return -1, errArgs
	}
	items := make([]client.Item, len(keys))
	for i := range items {
		items[i].Key = keys[i]
		if segs != nil {
			items[i].Segs = segs[i]
		} else {
			items[i].Buf = bufs[i]
		}
	}
	if err := h.c.BatchGet(context.Background(), items, mode); err != nil {
		return -1, err
	}
	return 0, results(items, outOK, outLens, false)
}

// BatchPutSG stores the concatenation of segs[i] under keys[i].
func (h *Handle) BatchPutSG(keys [][]byte, segs [][][]byte, outOK []int32) (int, error) {
	clear(outOK)
	if len(segs) != len(keys) || len(outOK) != len(keys) {
		return -1, errArgs
	}
	items := make([]client.Item, len(keys))
	for i := range items {
		items[i] = client.Item{Key: keys[i], Segs: segs[i]}
	}
	if err := h.c.BatchPut(context.Background(), items); err != nil {
		return -1, err
	}
	return 0, results(items, outOK, nil, false)
}

// BatchExist reports presence per key.
func (h *Handle) BatchExist(keys [][]byte, outOK []int32) (int, error) {
	return h.keysOnly(keys, outOK, h.c.BatchExist, false)
}

// BatchRemove removes every key; like Remove, an item is 1 when its owner confirmed the
// key gone (removed or already absent).
func (h *Handle) BatchRemove(keys [][]byte, outOK []int32) (int, error) {
	return h.keysOnly(keys, outOK, h.c.BatchRemove, true)
}

func (h *Handle) keysOnly(keys [][]byte, outOK []int32, f func(context.Context, []client.Item) error, absentOK bool) (int, error) {
	clear(outOK)
	if len(outOK) != len(keys) {
		return -1, errArgs
	}
	items := make([]client.Item, len(keys))
	for i := range items {
		items[i].Key = keys[i]
	}
	if err := f(context.Background(), items); err != nil {
		return -1, err
	}
	return 0, results(items, outOK, nil, absentOK)
}

// MaxSGSegs is the per-item segment limit.
func (h *Handle) MaxSGSegs() uint32 { return uint32(h.c.MaxSGSegs()) }

// RegisterMemory registers [base, base+size) for RDMA (once per device); only recorded on TCP.
// The memory is the caller's (C) and must stay valid while the client is open.
func (h *Handle) RegisterMemory(base unsafe.Pointer, size uint64) (int, error) {
	if base == nil || size == 0 || size > 1<<40 {
		return -1, errors.New("dfkv: register_memory of an empty or oversized region")
	}
	if err := h.c.RegisterMemory(unsafe.Slice((*byte)(base), size)); err != nil {
		return -1, err
	}
	return 0, nil
}

// UnregisterMemory undoes RegisterMemory for exactly [base, base+size): it waits for the
// in-flight ops that use the range, then deregisters it on every device; -1 for a range
// that is not registered (or still in use past the wait). After 0 the caller may free it.
func (h *Handle) UnregisterMemory(base unsafe.Pointer, size uint64) (int, error) {
	if base == nil || size == 0 || size > 1<<40 {
		return -1, errors.New("dfkv: unregister_memory of an empty or oversized region")
	}
	if err := h.c.UnregisterMemory(unsafe.Slice((*byte)(base), size)); err != nil {
		return -1, err
	}
	return 0, nil
}

// RegisterDMABuf registers bytes [offset, offset+size) of a DMA-BUF fd as device memory
// named by iova (client.RegisterDMABuf): GET destinations inside [iova, iova+size) are then
// served only by RDMA into it (client.ErrDirectUnsupported otherwise).
func (h *Handle) RegisterDMABuf(fd int, offset, size, iova uint64) (int, error) {
	if fd < 0 || size == 0 || iova == 0 || iova+size < iova || offset+size < offset {
		return -1, fmt.Errorf("dfkv: register_dmabuf: fd %d, offset %d, %d bytes at %#x: %w", fd, offset, size, iova, client.ErrInvalid)
	}
	if err := h.c.RegisterDMABuf(fd, offset, size, iova); err != nil {
		return -1, err
	}
	return 0, nil
}

// UnregisterDMABuf undoes RegisterDMABuf for exactly [iova, iova+size) (client.UnregisterDMABuf).
func (h *Handle) UnregisterDMABuf(iova, size uint64) (int, error) {
	if err := h.c.UnregisterDMABuf(iova, size); err != nil {
		return -1, err
	}
	return 0, nil
}

// TransportMode names the data transport.
func (h *Handle) TransportMode() string { return h.c.TransportMode() }

// StatsSnapshot renders the client's metrics (Prometheus text), the library's count of
// recovered panics and its caller-thread figures.
func (h *Handle) StatsSnapshot() []byte {
	b := fmt.Appendf(h.c.Snapshot(), "# HELP dfkv_cabi_panics_total Go panics the C ABI recovered into a failure return.\n"+
		"# TYPE dfkv_cabi_panics_total counter\ndfkv_cabi_panics_total %d\n", panics.Load())
	return callerStats(b)
}

var (
	panics    atomic.Uint64
	panicOnce sync.Once
)

// Recovered records a panic an export recovered: counted (dfkv_cabi_panics_total in every
// stats snapshot) and logged once per process, with its stack, so a bug is visible without
// flooding the host's stderr.
func Recovered(r any, stack []byte) error {
	panics.Add(1)
	panicOnce.Do(func() {
		fmt.Fprintf(os.Stderr, "dfkv: recovered a panic in the C ABI (further ones are only counted): %v\n%s\n", r, stack)
	})
	return fmt.Errorf("dfkv: internal error (recovered panic): %v", r)
}

// Version is dfkv_version's answer.
func Version() string { return version.Version }

// Deadlines a deployment may tune without an ABI change (the options struct is frozen):
// DFKV_CONNECT_TIMEOUT_MS (default 1000), DFKV_IO_TIMEOUT_MS (per request, default 5000) and
// DFKV_PEER_COOLDOWN_MS (after a peer I/O failure, default 3000); DFKV_FANOUT_THREADS (batch
// chunk goroutines per handle, default 32, at most 4096) is read here too. A malformed
// value refuses the open rather than silently running with a default.
//
// applyRDMAEnv reads the RDMA sizing twins: DFKV_RDMA_MAX_BLOCK (declared largest value
// over RDMA, bytes; larger values use TCP), DFKV_RDMA_DEPTH (requests in flight per
// connection), DFKV_RDMA_IDLE_TIMEOUT_MS (pooled connections idle this long are closed),
// DFKV_RDMA_NOTIFY=1 (native notifications), DFKV_RDMA_NOTIFY_OOB_FALLBACK=1 (their TCP
// fallback), DFKV_RDMA_GID_INDEX (source GID index, 0..255; unset = chosen per connection),
// DFKV_RDMA_HOP_LIMIT (1..255), DFKV_RDMA_TRAFFIC_CLASS (0..255) and
// DFKV_RDMA_REFUSAL_BACKOFF_MS (how long a server that refused RDMA stays on TCP first).
func applyRDMAEnv(o *client.RDMAOptions) error {
	if err := applyPathEnv(o); err != nil {
		return err
	}
	block, err := envInt("DFKV_RDMA_MAX_BLOCK", 0)
	if err != nil {
		return err
	}
	depth, err := envInt("DFKV_RDMA_DEPTH", 0)
	if err != nil {
		return err
	}
	idle, err := envInt("DFKV_RDMA_IDLE_TIMEOUT_MS", 0)
	if err != nil {
		return err
	}
	o.MaxBlock, o.Depth, o.IdleTimeout = uint64(block), uint32(min(depth, 1024)), time.Duration(idle)*time.Millisecond
	o.Notify = os.Getenv("DFKV_RDMA_NOTIFY") == "1"
	o.NotifyOOBFallback = os.Getenv("DFKV_RDMA_NOTIFY_OOB_FALLBACK") == "1"
	return applyRailEnv(o)
}

// applyPathEnv reads the GID choice twins (docs/RDMA.md §8).
func applyPathEnv(o *client.RDMAOptions) error {
	for _, e := range []struct {
		name   string
		lo, hi int
		set    func(int)
	}{
		{"DFKV_RDMA_GID_INDEX", 0, 255, func(n int) { o.GIDIndex = &n }},
		{"DFKV_RDMA_HOP_LIMIT", 1, 255, func(n int) { o.HopLimit = uint8(n) }},
		{"DFKV_RDMA_TRAFFIC_CLASS", 0, 255, func(n int) { o.TrafficClass = uint8(n) }},
		{"DFKV_RDMA_REFUSAL_BACKOFF_MS", 1, 3_600_000, func(n int) { o.RefusalBackoff = time.Duration(n) * time.Millisecond }},
	} {
		v := strings.TrimSpace(os.Getenv(e.name))
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < e.lo || n > e.hi {
			return fmt.Errorf("%s=%q: want %d..%d", e.name, v, e.lo, e.hi)
		}
		e.set(n)
	}
	return nil
}

// applyRailEnv reads the rail twins (docs/RDMA.md §4): DFKV_RDMA_NUMA (1 = prefer rails on
// the caller's NUMA node inside the chosen tier, 0 = off), DFKV_RDMA_NUMA_NODE (the
// caller's node; default: the node of the CPU that opens the handle),
// DFKV_RDMA_RAIL_CREDITS (connections in use per rail and server),
// DFKV_RDMA_RAIL_PROBE_MS (probe interval of a quarantined rail; 0 = default, -1 = off),
// DFKV_RDMA_RAIL_SLOW_FACTOR (latency demotion inside a tier; 0 = default, < 0 = off).
func applyRailEnv(o *client.RDMAOptions) error {
	switch v := strings.TrimSpace(os.Getenv("DFKV_RDMA_NUMA")); v {
	case "", "0":
	case "1":
		o.NUMA = true
	default:
		return fmt.Errorf("DFKV_RDMA_NUMA=%q: want 0 or 1", v)
	}
	o.NUMANode = client.AutoNUMANode
	if v := strings.TrimSpace(os.Getenv("DFKV_RDMA_NUMA_NODE")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1023 {
			return fmt.Errorf("DFKV_RDMA_NUMA_NODE=%q: want a node number 0..1023", v)
		}
		o.NUMANode = n
	}
	credits, err := envInt("DFKV_RDMA_RAIL_CREDITS", 0)
	if err != nil {
		return err
	}
	o.RailCredits = min(credits, 1<<16)
	if v := strings.TrimSpace(os.Getenv("DFKV_RDMA_RAIL_PROBE_MS")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 || n > 3_600_000 {
			return fmt.Errorf("DFKV_RDMA_RAIL_PROBE_MS=%q: want -1 (off), 0 (default) or 1..3600000", v)
		}
		o.RailProbeInterval = time.Duration(n) * time.Millisecond
	}
	if v := strings.TrimSpace(os.Getenv("DFKV_RDMA_RAIL_SLOW_FACTOR")); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || (f > 0 && f < 1) || f > 1e6 {
			return fmt.Errorf("DFKV_RDMA_RAIL_SLOW_FACTOR=%q: want 0 (default), a negative number (off) or 1..1000000", v)
		}
		o.RailSlowFactor = f
	}
	return nil
}

// splitList splits a device list on any of seps, dropping blanks.
func splitList(v, seps string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseTiers parses DFKV_RDMA_TIERS ("a,b;c": ';' separates tiers, leftmost is tier 0;
// ',' or '|' separates a tier's devices). client.New validates it against DFKV_RDMA_DEV;
// an empty tier is kept so that it is refused there rather than silently dropped.
func parseTiers(v string) [][]string {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	var out [][]string
	for _, t := range strings.Split(v, ";") {
		out = append(out, splitList(t, ",|"))
	}
	return out
}

func applyTimeoutEnv(o *client.Options) error {
	for _, t := range []struct {
		env string
		dst *time.Duration
	}{
		{"DFKV_CONNECT_TIMEOUT_MS", &o.ConnectTimeout},
		{"DFKV_IO_TIMEOUT_MS", &o.IOTimeout},
		{"DFKV_PEER_COOLDOWN_MS", &o.Cooldown},
	} {
		if _, set := os.LookupEnv(t.env); !set {
			continue
		}
		ms, err := envInt(t.env, 0)
		if err != nil {
			return err
		}
		*t.dst = time.Duration(ms) * time.Millisecond
	}
	// Not a deadline, but tuned the same way; the client refuses more than 4096.
	n, err := envInt(envFanout, 0)
	if err != nil {
		return err
	}
	o.FanoutThreads = n
	return nil
}

// securityEnv reads the client's TLS files and tenant token from the environment (the
// options struct is frozen): DFKV_TLS_CA (verify nodes and the MDS; setting any DFKV_TLS_*
// turns TLS on), DFKV_TLS_CERT and DFKV_TLS_KEY (client certificate for mTLS), DFKV_TOKEN
// (sent in HELLO and with MDS calls). A file that cannot be loaded refuses the open.
func securityEnv() (*tls.Config, string, error) {
	tok := os.Getenv("DFKV_TOKEN")
	ca, cert, key := os.Getenv("DFKV_TLS_CA"), os.Getenv("DFKV_TLS_CERT"), os.Getenv("DFKV_TLS_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, tok, nil
	}
	cfg, err := client.TLSFromFiles(ca, cert, key)
	if err != nil {
		return nil, "", fmt.Errorf("DFKV_TLS_CA/DFKV_TLS_CERT/DFKV_TLS_KEY: %w", err)
	}
	return cfg, tok, nil
}

// BatchExistLease looks keys up and leases the hits: outOK[i] = 1 hit and leased, 2 hit
// without a lease (the server's lease budget is spent), 0 miss or failure.
func (h *Handle) BatchExistLease(keys [][]byte, leaseMS uint32, outOK []int32) (int, error) {
	clear(outOK)
	if len(outOK) != len(keys) {
		return -1, errArgs
	}
	items := make([]client.Item, len(keys))
	for i := range items {
		items[i].Key = keys[i]
	}
	if err := h.c.BatchExistLease(context.Background(), items, time.Duration(leaseMS)*time.Millisecond); err != nil {
		return -1, err
	}
	var first error
	for i := range items {
		switch {
		case items[i].Err != nil:
			if first == nil {
				first = fmt.Errorf("item %d: %w", i, items[i].Err)
			}
		case items[i].Leased:
			outOK[i] = 1
		default:
			outOK[i] = 2
		}
	}
	return 0, first
}

// MaxValue is the largest value every current member accepts; 0 when unknown (no member
// reachable).
func (h *Handle) MaxValue() (uint64, error) {
	n, err := h.c.MaxValue(context.Background())
	if err != nil {
		return 0, err
	}
	return n, nil
}
