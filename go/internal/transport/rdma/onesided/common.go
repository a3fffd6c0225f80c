package onesided

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/dcp"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/notify"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Config configures either side.
type Config struct {
	Provider verbs.Provider
	// Device names the device to use; empty picks the first device with an ACTIVE port. A
	// named device that is missing or down is an error, never a silent fallback.
	Device string
	// Shared (client): the opened device (context, PD, pool MRs) to dial on, shared with the
	// caller's other connections; nil opens one for this connection alone (Provider, Device).
	Shared *Device
	// Depth: requests in flight per connection (client: offered; server: most granted).
	Depth uint32
	// MaxBlock: the largest value (client: declared; server: most accepted).
	MaxBlock uint64
	// MaxTargets: GET targets per request (client: offered; server: most granted).
	MaxTargets uint32
	// SegmentBytes is the server's receive segment budget, shared by all connections.
	SegmentBytes uint64
	// ForceV1: a server answers every offer with v1 (DFKV_RDMA_SERVER_PROTOCOL=1); a client
	// offers v1 (DFKV_RDMA_PROTOCOL=1, or after a server asked it to fall back).
	ForceV1   bool
	IOTimeout time.Duration
	Logger    *slog.Logger
	// Metrics, when set, is shared by the connections (a client's pool); else each Client
	// and Server has its own.
	Metrics *Metrics
	// MRCacheBytes bounds a client connection's cache of transient MRs (ad-hoc
	// registrations of unregistered caller memory): 0 = 32 MiB; < 0 = no cache, every
	// ad-hoc MR is deregistered when its op completes (memory Go does not own: the C ABI).
	MRCacheBytes int64
	// AdhocMinBytes: unregistered pieces smaller than this are copied through the staging
	// slot instead of registered (registration costs more than a small copy); 0 = 16 KiB.
	AdhocMinBytes int
	// Notify configures native notifications (notify.go, docs/RDMA.md "Notifications").
	Notify NotifyConfig
	// GID is the operator's part of each connection's source GID choice: an index
	// override, the hop limit and the traffic class (gid.go, docs/RDMA.md §8).
	GID verbs.GIDPolicy
	// NoDeviceTargets (server) declines GET targets in device memory (DMA-BUF MRs; every
	// v2 client asks, Client.DeviceTargets says what the server answered): such a client
	// then refuses direct loads to it.
	NoDeviceTargets bool

	// shared, set by NewRailServer, is the receive segment every rail's Server registers
	// on its own PD instead of allocating one.
	shared *sharedSegment
}

func (c *Config) defaults() {
	if c.Depth == 0 {
		c.Depth = 16
	}
	if c.MaxBlock == 0 {
		c.MaxBlock = 4 << 20
	}
	if c.MaxTargets == 0 {
		c.MaxTargets = 16
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = 256 << 20
	}
	if c.IOTimeout <= 0 {
		c.IOTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MRCacheBytes == 0 {
		c.MRCacheBytes = 32 << 20
	}
	if c.AdhocMinBytes <= 0 {
		c.AdhocMinBytes = 16 << 10
	}
}

// busyPrefix starts the reason of a refusal for capacity (ErrBusy).
const busyPrefix = "busy: "

// maxTargetsInSlot: the prefix and the targets share the request's first page.
const maxTargetsInSlot = (dcp.SlotPayloadOffset - wire.RequestSize) / targetSize

// MaxTargets is the most GET targets one request can carry (Config.MaxTargets' bound).
const MaxTargets = maxTargetsInSlot

func (c *Config) limits() dcp.Limits {
	l := dcp.DefaultLimits
	l.MaxBlock = max(c.MaxBlock, l.MaxBlock)
	l.MaxTargets = min(max(c.MaxTargets, 1), maxTargetsInSlot)
	return l
}

var (
	// ErrRefused: the server refused the bootstrap (its reason is in the message).
	ErrRefused = errors.New("onesided: server refused RDMA")
	// ErrBusy (with ErrRefused): the server refused for want of capacity right now (its
	// receive segment is exhausted); another connection may succeed soon. On the wire a
	// refusal whose reason starts with busyPrefix.
	ErrBusy = errors.New("onesided: server busy")
	// ErrBroken: the connection failed (completion error, protocol violation, timeout); it
	// must be closed and its outstanding requests retried elsewhere or failed.
	ErrBroken = errors.New("onesided: connection broken")
	// ErrPeerClosed (with ErrBroken): the server closed the connection's bootstrap TCP
	// connection (it exited, was killed, or ended the session); nothing more will complete.
	ErrPeerClosed = errors.New("onesided: server closed the bootstrap connection")
	// ErrDirectRefused: a GET into device memory (Op.Direct) this connection cannot run
	// as one RDMA WRITE into registered targets (the server does not accept device targets,
	// a piece lies outside every registered range, more pieces than the granted targets).
	// Nothing was posted; the connection stays usable.
	ErrDirectRefused = errors.New("onesided: direct device load refused")
)

// pickDevice opens the named device, or the first with an ACTIVE port.
func pickDevice(p verbs.Provider, name string) (verbs.Context, verbs.PortInfo, error) {
	devs, err := p.Devices()
	if err != nil {
		return nil, verbs.PortInfo{}, err
	}
	for _, d := range devs {
		if name != "" && d.Name != name {
			continue
		}
		port, ok := d.ActivePort()
		if !ok {
			if name != "" {
				return nil, verbs.PortInfo{}, fmt.Errorf("onesided: device %s has no ACTIVE port", name)
			}
			continue
		}
		ctx, err := p.Open(d.Name)
		if err != nil {
			return nil, verbs.PortInfo{}, err
		}
		return ctx, port, nil
	}
	if name != "" {
		return nil, verbs.PortInfo{}, fmt.Errorf("%w: %s has no device %q", verbs.ErrNoDevice, p.Name(), name)
	}
	return nil, verbs.PortInfo{}, fmt.Errorf("%w: %s: no device with an ACTIVE port", verbs.ErrNoDevice, p.Name())
}

// Metrics are the RDMA counters, named as in the seed (dfkv_rdma_*).
type Metrics struct {
	V1ConnsOpened    atomic.Int64
	V2ConnsOpened    atomic.Int64
	V2PutWrites      atomic.Int64
	V2GetWrites      atomic.Int64
	Completions      atomic.Int64
	CompletionErrors atomic.Int64
	ActiveConns      atomic.Int64
	Refused          atomic.Int64
	PinWaits         atomic.Int64 // a request waited for its slot's previous SEND completion
	PinsHeld         atomic.Int64
	ZeroCopyGets     atomic.Int64 // GETs written straight from the RAM tier's arena
	V1Puts           atomic.Int64
	V1Gets           atomic.Int64

	// Memory registration (docs/RDMA.md, "MR pool"): requests whose caller memory lay in a
	// registered pool (RegisterMemory; on the server the RAM tier's arena), ad-hoc MRs
	// registered for unregistered memory (cache hits, evictions, releases, failures, the
	// cache's bytes), and requests copied through a staging slot instead.
	MRPoolOps        atomic.Int64
	MRAdhocRegs      atomic.Int64
	MRAdhocReleased  atomic.Int64
	MRAdhocFailures  atomic.Int64
	MRCacheHits      atomic.Int64
	MRCacheEvictions atomic.Int64
	MRCacheBytes     atomic.Int64
	StagedOps        atomic.Int64
	// Devices and PDs open, and pool registrations: a pool (RegisterMemory; the server's
	// RAM-tier arena) is registered once per device, never per connection.
	DevicesOpen  atomic.Int64
	PDsOpen      atomic.Int64
	MRPoolRegs   atomic.Int64
	MRPoolDeregs atomic.Int64
	MRPoolBytes  atomic.Int64
	// Device memory (RegisterDMABuf) and direct loads into it: registrations (refused by
	// the NIC: RegFailures), bytes registered; GETs that completed into device targets, their
	// bytes and their post-to-reply time; GETs into device targets that failed after being
	// posted (Failures) or were refused before (Refused: a server without device targets).
	DMABufRegs        atomic.Int64
	DMABufRegFailures atomic.Int64
	DMABufDeregs      atomic.Int64
	DMABufBytes       atomic.Int64
	DirectGets        atomic.Int64
	DirectBytes       atomic.Int64
	DirectNanos       atomic.Int64
	DirectFailures    atomic.Int64
	DirectRefused     atomic.Int64
	// IdleReclaims: pooled connections closed after sitting idle past the idle timeout.
	IdleReclaims atomic.Int64
	// PoolFull: a client op found every RDMA connection to its server busy (MaxConns) and
	// went over TCP.
	PoolFull atomic.Int64
	// Notify counts native notifications (dfkv_rdma_notify_*) of the devices and connections
	// these metrics belong to.
	Notify notify.Metrics
	// StaleCompletions: completions whose wr_id carries another QP generation (a late
	// completion of an earlier connection), dropped instead of delivered (docs/RDMA.md,
	// "Generation fencing").
	StaleCompletions atomic.Int64
	// PortDownBreaks: windows a connection ended because its port was not ACTIVE
	// (verbs.ErrPortDown) while no completion said so (Soft-RoCE after a link went down).
	PortDownBreaks atomic.Int64
	// SG: multi-SGE requests per QP (sg.go).
	SG SGMetrics
}

// Snapshot returns the metrics by their exported names.
func (m *Metrics) Snapshot() map[string]float64 {
	s := m.snapshot()
	for k, v := range m.Notify.Snapshot() {
		s[k] = v
	}
	return s
}

func (m *Metrics) snapshot() map[string]float64 {
	out := map[string]float64{
		"dfkv_rdma_v1_conns_opened_total":              float64(m.V1ConnsOpened.Load()),
		"dfkv_rdma_v2_conns_opened_total":              float64(m.V2ConnsOpened.Load()),
		"dfkv_rdma_v2_put_writes_total":                float64(m.V2PutWrites.Load()),
		"dfkv_rdma_v2_get_writes_total":                float64(m.V2GetWrites.Load()),
		"dfkv_rdma_completions_total":                  float64(m.Completions.Load()),
		"dfkv_rdma_completion_errors_total":            float64(m.CompletionErrors.Load()),
		"dfkv_rdma_active_conns":                       float64(m.ActiveConns.Load()),
		"dfkv_rdma_refused_total":                      float64(m.Refused.Load()),
		"dfkv_rdma_pin_waits_total":                    float64(m.PinWaits.Load()),
		"dfkv_rdma_pins_held":                          float64(m.PinsHeld.Load()),
		"dfkv_rdma_v2_get_zero_copy_total":             float64(m.ZeroCopyGets.Load()),
		"dfkv_rdma_v1_puts_total":                      float64(m.V1Puts.Load()),
		"dfkv_rdma_v1_gets_total":                      float64(m.V1Gets.Load()),
		"dfkv_rdma_mr_pool_ops_total":                  float64(m.MRPoolOps.Load()),
		"dfkv_rdma_mr_adhoc_registrations_total":       float64(m.MRAdhocRegs.Load()),
		"dfkv_rdma_mr_adhoc_releases_total":            float64(m.MRAdhocReleased.Load()),
		"dfkv_rdma_mr_adhoc_failures_total":            float64(m.MRAdhocFailures.Load()),
		"dfkv_rdma_mr_cache_hits_total":                float64(m.MRCacheHits.Load()),
		"dfkv_rdma_mr_cache_evictions_total":           float64(m.MRCacheEvictions.Load()),
		"dfkv_rdma_mr_cache_bytes":                     float64(m.MRCacheBytes.Load()),
		"dfkv_rdma_staged_ops_total":                   float64(m.StagedOps.Load()),
		"dfkv_rdma_devices_open":                       float64(m.DevicesOpen.Load()),
		"dfkv_rdma_pds_open":                           float64(m.PDsOpen.Load()),
		"dfkv_rdma_mr_pool_registrations_total":        float64(m.MRPoolRegs.Load()),
		"dfkv_rdma_mr_pool_deregistrations_total":      float64(m.MRPoolDeregs.Load()),
		"dfkv_rdma_mr_pool_bytes":                      float64(m.MRPoolBytes.Load()),
		"dfkv_rdma_dmabuf_registrations_total":         float64(m.DMABufRegs.Load()),
		"dfkv_rdma_dmabuf_registration_failures_total": float64(m.DMABufRegFailures.Load()),
		"dfkv_rdma_dmabuf_deregistrations_total":       float64(m.DMABufDeregs.Load()),
		"dfkv_rdma_dmabuf_bytes":                       float64(m.DMABufBytes.Load()),
		"dfkv_rdma_direct_gets_total":                  float64(m.DirectGets.Load()),
		"dfkv_rdma_direct_bytes_total":                 float64(m.DirectBytes.Load()),
		"dfkv_rdma_direct_transfer_seconds_total":      float64(m.DirectNanos.Load()) / 1e9,
		"dfkv_rdma_direct_failures_total":              float64(m.DirectFailures.Load()),
		"dfkv_rdma_direct_refused_total":               float64(m.DirectRefused.Load()),
		"dfkv_rdma_idle_reclaims_total":                float64(m.IdleReclaims.Load()),
		"dfkv_rdma_pool_full_total":                    float64(m.PoolFull.Load()),
		"dfkv_rdma_stale_completions_total":            float64(m.StaleCompletions.Load()),
		"dfkv_rdma_port_down_breaks_total":             float64(m.PortDownBreaks.Load()),
	}
	m.SG.add(out)
	return out
}

// pollSlice bounds one wait on the receive CQ so that send-side errors (which complete on
// the other CQ) are noticed too.
const pollSlice = 50 * time.Millisecond

// A late completion makes a connection ask its port's state (verbs.PortStater) once per
// wait slice after lateAfter; before posting it asks at most every portCheckEvery
// (ibv_query_port is a system call). peerGrace is how long replies may still land after
// the server closed the bootstrap connection (a clean close after its last reply).
const (
	lateAfter      = 100 * time.Millisecond
	portCheckEvery = 20 * time.Millisecond
	peerGrace      = 200 * time.Millisecond
)
