package verbs

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors callers branch on. Providers wrap them with context.
var (
	// ErrNoDevice: the provider works but no RDMA device is present (or none matched).
	ErrNoDevice = errors.New("verbs: no RDMA device")
	// ErrUnavailable: the provider cannot run here (library missing, kernel support missing).
	ErrUnavailable = errors.New("verbs: provider unavailable")
	// ErrQueueFull: a post would exceed the queue's capacity (ibv_post_* returns ENOMEM).
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrInvalid: an argument violates the verbs contract (bad state transition, too many
	// SGEs, unknown opcode, zero-length registration...). Nothing was queued.
	ErrInvalid = errors.New("verbs: invalid argument")
	// ErrClosed: the object (or its parent) was destroyed.
	ErrClosed = errors.New("verbs: object closed")
	// ErrCQOverflow: more completions arrived than the CQ holds; the CQ is unusable, as on
	// hardware, where overflow is a fatal asynchronous error.
	ErrCQOverflow = errors.New("verbs: completion queue overflow")
	// ErrPortDown: the port a QP runs on is not ACTIVE. Some stacks (Soft-RoCE after `ip
	// link set … down`) report that only in the port's state: its QPs see no completion
	// error or async event, their WRs just never complete.
	ErrPortDown = errors.New("verbs: port not active")
	// ErrDMABufUnsupported: the provider, the library or the NIC's driver cannot import a
	// DMA-BUF (RegDMABuf); the error names the errno where the driver gave one.
	ErrDMABufUnsupported = errors.New("verbs: DMA-BUF registration not supported")
)

// PortStater is implemented by a Context that can read one port's current state
// (ibv_query_port) at run time, cheaply enough to ask while a completion is late.
type PortStater interface {
	PortState(port uint8) (PortState, error)
}

// Provider is one implementation of the seam (soft, ibverbs).
type Provider interface {
	// Name is the provider's name as selected by --rdma-provider ("soft", "ibverbs").
	Name() string
	// Devices lists the devices visible to this process. An empty list is returned as an
	// error wrapping ErrNoDevice; a provider that cannot run wraps ErrUnavailable.
	Devices() ([]DeviceInfo, error)
	// Open opens a device by name (ibv_open_device).
	Open(name string) (Context, error)
}

// PortState is ibv_port_state.
type PortState uint8

// Port states, numbered as in libibverbs.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// PhysState is the port's physical state as reported by ibv_query_port (phys_state).
type PhysState uint8

// Physical port states (IB spec numbering, as libibverbs reports them).
const (
	PhysSleep    PhysState = 1
	PhysPolling  PhysState = 2
	PhysDisabled PhysState = 3
	PhysTraining PhysState = 4
	PhysLinkUp   PhysState = 5
	PhysLinkErr  PhysState = 6
	PhysPhyTest  PhysState = 7
)

func (s PhysState) String() string {
	switch s {
	case PhysSleep:
		return "SLEEP"
	case PhysPolling:
		return "POLLING"
	case PhysDisabled:
		return "DISABLED"
	case PhysTraining:
		return "TRAINING"
	case PhysLinkUp:
		return "LINK_UP"
	case PhysLinkErr:
		return "LINK_ERROR_RECOVERY"
	case PhysPhyTest:
		return "PHY_TEST"
	}
	return fmt.Sprintf("PhysState(%d)", uint8(s))
}

// GID is a 128-bit port address.
type GID [16]byte

func (g GID) String() string {
	return fmt.Sprintf("%x:%x:%x:%x:%x:%x:%x:%x",
		uint16(g[0])<<8|uint16(g[1]), uint16(g[2])<<8|uint16(g[3]),
		uint16(g[4])<<8|uint16(g[5]), uint16(g[6])<<8|uint16(g[7]),
		uint16(g[8])<<8|uint16(g[9]), uint16(g[10])<<8|uint16(g[11]),
		uint16(g[12])<<8|uint16(g[13]), uint16(g[14])<<8|uint16(g[15]))
}

// IsZero reports whether the GID is unset (hardware reports an all-zero GID for an
// unconfigured index).
func (g GID) IsZero() bool { return g == GID{} }

// PortInfo describes one port (ibv_query_port + ibv_query_gid index 0; the whole GID
// table is Context.GIDTable).
type PortInfo struct {
	Num       uint8 // 1-based, as in verbs
	State     PortState
	PhysState PhysState
	LID       uint16
	GID       GID
	MTU       uint32 // active MTU in bytes
	LinkLayer string // "InfiniBand" or "Ethernet"
}

// DeviceInfo describes one device (HCA).
type DeviceInfo struct {
	Name     string
	NUMANode int // -1 when unknown
	Ports    []PortInfo
	// Limits the device enforces (ibv_query_device).
	MaxQPWR  int
	MaxSGE   int
	MaxCQE   int
	MaxMRLen uint64
}

// ActivePort returns the first ACTIVE port, or false.
func (d DeviceInfo) ActivePort() (PortInfo, bool) {
	for _, p := range d.Ports {
		if p.State == PortActive {
			return p, true
		}
	}
	return PortInfo{}, false
}

// Access is the set of ibv_access_flags of a memory region or QP.
type Access uint32

// Access flags, bit-compatible with libibverbs.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
)

// Context is an open device (ibv_context).
type Context interface {
	Info() DeviceInfo
	AllocPD() (PD, error)
	// GIDTable returns the port's valid GID entries with their types (ChooseGID picks one
	// per connection).
	GIDTable(port uint8) ([]GIDEntry, error)
	// CreateCQ creates a completion queue holding up to depth completions.
	CreateCQ(depth int) (CQ, error)
	Close() error
}

// PD is a protection domain: MRs are usable only by QPs of the same PD.
type PD interface {
	// RegMR registers buf with the given access. Remote write/read requires the
	// provider-specific local write rules of verbs (RemoteWrite implies LocalWrite).
	RegMR(buf []byte, access Access) (MR, error)
	// RegDMABuf registers bytes [offset, offset+size) of the DMA-BUF fd (device memory:
	// ibv_reg_dmabuf_mr), named by peers and SGEs as [iova, iova+size). The MR's Bytes is
	// nil where the host does not map the memory. The fd may be closed afterwards. A
	// provider or NIC that cannot import it fails wrapping ErrDMABufUnsupported.
	RegDMABuf(fd int, offset, size, iova uint64, access Access) (MR, error)
	CreateQP(cfg QPConfig) (QP, error)
	Close() error
}

// MR is a registered memory region.
type MR interface {
	// Addr is the region's address as seen by remote peers (the virtual address of buf[0]).
	Addr() uint64
	Len() int
	LKey() uint32
	RKey() uint32
	Access() Access
	// Bytes is the registered memory itself (nil for device memory the host cannot map).
	Bytes() []byte
	Close() error
}

// QPType is the transport service; only reliable connected is supported.
type QPType uint8

// QP types.
const QPTypeRC QPType = 2 // IBV_QPT_RC

// QPConfig is ibv_qp_init_attr.
type QPConfig struct {
	Type       QPType
	SendCQ     CQ
	RecvCQ     CQ
	MaxSendWR  int
	MaxRecvWR  int
	MaxSendSGE int
	MaxRecvSGE int
	// SignalAll makes every send WR signaled (sq_sig_all).
	SignalAll bool
}

// QPState is ibv_qp_state.
type QPState uint8

// QP states, numbered as in libibverbs.
const (
	QPReset QPState = 0
	QPInit  QPState = 1
	QPRTR   QPState = 2
	QPRTS   QPState = 3
	QPSQD   QPState = 4
	QPSQE   QPState = 5
	QPErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPSQD:
		return "SQD"
	case QPSQE:
		return "SQE"
	case QPErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// QPAttr is the subset of ibv_qp_attr used by RC connection setup. Which fields are read
// depends on the target state, as in ibv_modify_qp:
//
//	INIT: PortNum, Access (remote access the QP allows)
//	RTR:  PathMTU, DestQPNum, RQPSN, Remote (GID, LID) — the peer's address — and Path
//	      (the source GID index, hop limit and traffic class)
//	RTS:  SQPSN, Timeout/RetryCount/RNRRetry
//	ERR, RESET: nothing
type QPAttr struct {
	State      QPState
	PortNum    uint8
	Access     Access
	PathMTU    uint32
	DestQPNum  uint32
	RQPSN      uint32
	SQPSN      uint32
	RemoteGID  GID
	RemoteLID  uint16
	Path       Path
	Timeout    uint8 // 4.096 µs * 2^Timeout per transport retry; 0 means the provider default
	RetryCount uint8
	RNRRetry   uint8
}

// Endpoint is what a QP's peer needs to connect to it (exchanged out of band, in dfkv over
// the DCP tail).
type Endpoint struct {
	QPNum   uint32
	PSN     uint32
	GID     GID
	GIDType GIDType
	LID     uint16
	Port    uint8
	MTU     uint32
}

// QP is a reliable-connected queue pair.
type QP interface {
	Num() uint32
	State() QPState
	// Modify transitions the QP (ibv_modify_qp). Transitions other than
	// RESET->INIT->RTR->RTS, any->ERR and any->RESET fail with ErrInvalid.
	Modify(attr QPAttr) error
	// PostSend queues send WRs in order. On error none of wrs from the failing one on are
	// queued; the index of the first unqueued WR is returned with the error.
	PostSend(wrs []SendWR) (int, error)
	PostRecv(wrs []RecvWR) (int, error)
	Close() error
}

// Opcode is the work request opcode (ibv_wr_opcode).
type Opcode uint8

// Send opcodes, numbered as in libibverbs.
const (
	OpWrite        Opcode = 0
	OpWriteWithImm Opcode = 1
	OpSend         Opcode = 2
	OpSendWithImm  Opcode = 3
	OpRead         Opcode = 4
)

func (o Opcode) String() string {
	switch o {
	case OpWrite:
		return "RDMA_WRITE"
	case OpWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case OpSend:
		return "SEND"
	case OpSendWithImm:
		return "SEND_WITH_IMM"
	case OpRead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// SGE is a scatter/gather element in registered memory: Addr is an address inside the MR
// named by LKey (MR.Addr()+offset).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendFlags are ibv_send_flags.
type SendFlags uint32

// Send flags, bit-compatible with libibverbs.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// SendWR is ibv_send_wr for RC. RemoteAddr/RKey are used by WRITE/READ; Imm by *_WITH_IMM.
type SendWR struct {
	ID         uint64
	Opcode     Opcode
	Flags      SendFlags
	SGL        []SGE
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32
}

// RecvWR is ibv_recv_wr.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WCStatus is ibv_wc_status.
type WCStatus uint8

// Completion statuses, numbered as in libibverbs.
const (
	StatusSuccess        WCStatus = 0
	StatusLocLenErr      WCStatus = 1
	StatusLocQPOpErr     WCStatus = 2
	StatusLocProtErr     WCStatus = 4
	StatusWRFlushErr     WCStatus = 5
	StatusRemInvReqErr   WCStatus = 9
	StatusRemAccessErr   WCStatus = 10
	StatusRemOpErr       WCStatus = 11
	StatusRetryExcErr    WCStatus = 12
	StatusRNRRetryExcErr WCStatus = 13
	StatusGeneralErr     WCStatus = 21
)

func (s WCStatus) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusLocLenErr:
		return "local length error"
	case StatusLocQPOpErr:
		return "local QP operation error"
	case StatusLocProtErr:
		return "local protection error"
	case StatusWRFlushErr:
		return "WR flushed"
	case StatusRemInvReqErr:
		return "remote invalid request"
	case StatusRemAccessErr:
		return "remote access error"
	case StatusRemOpErr:
		return "remote operation error"
	case StatusRetryExcErr:
		return "transport retry counter exceeded"
	case StatusRNRRetryExcErr:
		return "RNR retry counter exceeded"
	case StatusGeneralErr:
		return "general error"
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// WCOpcode is ibv_wc_opcode.
type WCOpcode uint8

// Completion opcodes, numbered as in libibverbs.
const (
	WCSend         WCOpcode = 0
	WCWrite        WCOpcode = 1
	WCRead         WCOpcode = 2
	WCRecv         WCOpcode = 128
	WCRecvWithImm  WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
	WCUnknownFlush WCOpcode = 255 // flushed completions carry no valid opcode on hardware
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCWrite:
		return "RDMA_WRITE"
	case WCRead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WorkCompletion is ibv_wc.
type WorkCompletion struct {
	ID      uint64
	Status  WCStatus
	Opcode  WCOpcode
	ByteLen uint32 // bytes received (receive completions)
	Imm     uint32
	HasImm  bool // IBV_WC_WITH_IMM
	QPNum   uint32
}

// Err returns nil for a successful completion, or an error naming the status.
func (wc WorkCompletion) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{WC: wc}
}

// CompletionError is a failed work completion.
type CompletionError struct{ WC WorkCompletion }

func (e *CompletionError) Error() string {
	return fmt.Sprintf("verbs: wr %d on qp %d: %s", e.WC.ID, e.WC.QPNum, e.WC.Status)
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs without blocking (ibv_poll_cq).
	Poll(wcs []WorkCompletion) (int, error)
	// Wait blocks until the CQ may hold a completion, ctx ends, or the CQ is closed
	// (completion channel + ibv_req_notify_cq). Spurious wake-ups are allowed: poll after.
	Wait(ctx context.Context) error
	Close() error
}
