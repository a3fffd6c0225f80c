package railset

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Options configure a Set; the caller's public RDMA options map onto them field by field
// (go/client's RDMAOptions documents each), plus what the transport needs of its caller.
type Options struct {
	Provider          string // "ibverbs" (default) or "soft"
	Device            string // "" = first device with an ACTIVE port
	Devices           []string
	Primary           string
	Tiers             [][]string
	RailQuarantine    time.Duration // default 10 s
	RailProbeInterval time.Duration // default 1 s; < 0 = no probing
	RailCredits       int
	RailSlowFactor    float64 // 0 = default 4, < 0 = off, else >= 1
	NUMA              bool
	NUMANode          int // < 0: the node of the CPU that calls New
	SoftNUMANodes     []int
	SoftDevices       int
	SoftFaultFile     string
	SoftNoDMABuf      bool
	Depth             uint32 // default 4
	MaxBlock          uint64 // default 4 MiB, at most MaxValue
	ForceV1           bool
	MaxConns          int // default PoolSize
	IdleTimeout       time.Duration
	SGLaneConns       int
	MRCacheBytes      int64
	Notify            bool
	NotifyOOBFallback bool
	RefusalBackoff    time.Duration
	RefusalBackoffMax time.Duration
	GID               verbs.GIDPolicy

	PoolSize  int           // the caller's per-server pool size (idle bound, default budgets)
	IOTimeout time.Duration // bounds every op, bootstrap and credit wait
	MaxValue  uint64        // the caller's largest value
	Tenant    uint64        // the tenant of probe requests
	Logger    *slog.Logger
	// Registerer takes the dfkv_rdma_* series; nil registers none.
	Registerer prometheus.Registerer
	// Published returns the rails the server at addr publishes (nil: none, or unknown).
	Published func(addr string) []wire.Rail
	Errors    Errors
}

// Errors are the caller's error vocabulary: the transport wraps these so that what it
// returns matches the caller's API under errors.Is and reads as the caller's own errors.
type Errors struct {
	Invalid, Timeout, Closed, Busy error
	// Ctx wraps the caller's context ending; IO a transport failure towards addr.
	Ctx, IO func(addr string, err error) error
}

// ErrNoCompatibleRail: no RDMA rail this client may use is published healthy by the server
// (or the client has tiers and the server publishes no rails). Client-local: the op goes
// over TCP and the peer's health is untouched.
var ErrNoCompatibleRail = errors.New("dfkv: no compatible RDMA rail")

// Host errors that say why a bootstrap left the server on TCP.
var (
	// ErrNotServed: the server answered the bootstrap request with a failure status.
	ErrNotServed = errors.New("server does not serve RDMA")
	// ErrNoNetConn: the caller's transport streams are not net.Conns.
	ErrNoNetConn = errors.New("the transport's connections cannot carry the RDMA bootstrap")
)

// Host is the caller's side of one server.
type Host interface {
	Addr() string
	// Bootstrap opens a fresh connection to the server and runs the RDMA bootstrap request
	// on it, bounded by ctx and the I/O timeout; the connection it returns carries the dcp
	// exchange next. ErrNotServed and ErrNoNetConn say why RDMA cannot be had there; any
	// other error is the caller's to report over TCP.
	Bootstrap(ctx context.Context) (net.Conn, error)
	MarkHealthy()
	MarkFailed()
}
