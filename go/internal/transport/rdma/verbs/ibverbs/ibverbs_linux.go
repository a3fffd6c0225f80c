//go:build linux && cgo

package ibverbs

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// DefaultLibrary is the soname dlopen'ed when Options.Library is empty.
const DefaultLibrary = "libibverbs.so.1"

// Options configures the provider.
type Options struct {
	// Library is the path or soname of libibverbs; default DefaultLibrary.
	Library string
	// SysClass is where device attributes (NUMA node) are read; default
	// /sys/class/infiniband.
	SysClass string
}

// Provider is the ibverbs provider. Loading happens on first use.
type Provider struct {
	opt     Options
	once    sync.Once
	loadErr error
}

// New returns an ibverbs provider; it does not touch the library yet.
func New(opt Options) *Provider {
	if opt.Library == "" {
		opt.Library = DefaultLibrary
	}
	if opt.SysClass == "" {
		opt.SysClass = "/sys/class/infiniband"
	}
	return &Provider{opt: opt}
}

// Name implements verbs.Provider.
func (p *Provider) Name() string { return "ibverbs" }

// The C side holds one library per process; loaded names it once a load succeeded.
var (
	loadMu sync.Mutex
	loaded string
)

// load dlopens the library once per provider. A second provider naming another library
// than the one already loaded is refused rather than silently given the first.
func (p *Provider) load() error {
	p.once.Do(func() {
		loadMu.Lock()
		defer loadMu.Unlock()
		path := C.CString(p.opt.Library)
		defer C.free(unsafe.Pointer(path))
		var buf [512]C.char
		if loaded != "" && loaded != p.opt.Library {
			// Say what is wrong with the other library if anything; else that it cannot
			// replace the loaded one.
			if C.dfkv_ibv_probe(path, &buf[0], C.size_t(len(buf))) != 0 {
				p.loadErr = fmt.Errorf("%w: ibverbs: %s", verbs.ErrUnavailable, strings.ReplaceAll(C.GoString(&buf[0]), "\n", " "))
				return
			}
			p.loadErr = fmt.Errorf("%w: ibverbs: %s is loaded already; cannot load %s", verbs.ErrUnavailable, loaded, p.opt.Library)
			return
		}
		if C.dfkv_ibv_load(path, &buf[0], C.size_t(len(buf))) != 0 {
			msg := strings.ReplaceAll(C.GoString(&buf[0]), "\n", " ")
			p.loadErr = fmt.Errorf("%w: ibverbs: %s", verbs.ErrUnavailable, msg)
			return
		}
		loaded = p.opt.Library
	})
	return p.loadErr
}

func errnoText(e C.int) string {
	if e == 0 {
		return "no error reported"
	}
	return syscall.Errno(e).Error()
}

// deviceList returns the devices, or one line saying why there are none.
func (p *Provider) deviceList() (**C.struct_ibv_device, int, error) {
	if err := p.load(); err != nil {
		return nil, 0, err
	}
	var n, e C.int
	l := C.dfkv_ibv_get_device_list(&n, &e)
	if l == nil {
		why := errnoText(e)
		if syscall.Errno(e) == syscall.ENOSYS {
			why += " (the kernel has no RDMA support loaded)"
		}
		return nil, 0, fmt.Errorf("%w: ibverbs: ibv_get_device_list: %s", verbs.ErrNoDevice, why)
	}
	if n == 0 {
		C.dfkv_ibv_free_device_list(l)
		return nil, 0, fmt.Errorf("%w: ibverbs: libibverbs found no RDMA device", verbs.ErrNoDevice)
	}
	return l, int(n), nil
}

func devAt(l **C.struct_ibv_device, i int) *C.struct_ibv_device {
	return *(**C.struct_ibv_device)(unsafe.Add(unsafe.Pointer(l), uintptr(i)*unsafe.Sizeof(*l)))
}

// Devices implements verbs.Provider: every device with its ports' state and GID index 0
// (a connection reads the whole table: devContext.GIDTable).
func (p *Provider) Devices() ([]verbs.DeviceInfo, error) {
	l, n, err := p.deviceList()
	if err != nil {
		return nil, err
	}
	defer C.dfkv_ibv_free_device_list(l)
	var out []verbs.DeviceInfo
	for i := range n {
		d := devAt(l, i)
		name := C.GoString(C.dfkv_ibv_get_device_name(d))
		var e C.int
		c := C.dfkv_ibv_open_device(d, &e)
		if c == nil {
			return nil, fmt.Errorf("ibverbs: open %s: %s", name, errnoText(e))
		}
		info, err := p.query(c, name)
		C.dfkv_ibv_close_device(c)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

func (p *Provider) numaNode(name string) int {
	b, err := os.ReadFile(filepath.Join(p.opt.SysClass, name, "device", "numa_node"))
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return v
}

var mtuBytes = map[C.enum_ibv_mtu]uint32{C.IBV_MTU_256: 256, C.IBV_MTU_512: 512, C.IBV_MTU_1024: 1024, C.IBV_MTU_2048: 2048, C.IBV_MTU_4096: 4096}

func mtuEnum(b uint32) C.int {
	switch {
	case b >= 4096:
		return C.IBV_MTU_4096
	case b >= 2048:
		return C.IBV_MTU_2048
	case b >= 1024:
		return C.IBV_MTU_1024
	case b >= 512:
		return C.IBV_MTU_512
	}
	return C.IBV_MTU_256
}

func (p *Provider) query(c *C.struct_ibv_context, name string) (verbs.DeviceInfo, error) {
	info, _, err := p.queryTables(c, name)
	return info, err
}

// queryTables is query with each port's GID table length.
func (p *Provider) queryTables(c *C.struct_ibv_context, name string) (info verbs.DeviceInfo, tblLen []int, err error) {
	var da C.struct_ibv_device_attr
	if rc := C.dfkv_ibv_query_device(c, &da); rc != 0 {
		return verbs.DeviceInfo{}, nil, fmt.Errorf("ibverbs: query %s: %s", name, errnoText(rc))
	}
	info = verbs.DeviceInfo{
		Name: name, NUMANode: p.numaNode(name),
		MaxQPWR: int(da.max_qp_wr), MaxSGE: int(da.max_sge), MaxCQE: int(da.max_cqe), MaxMRLen: uint64(da.max_mr_size),
	}
	for port := 1; port <= int(da.phys_port_cnt); port++ {
		var pa C.struct_ibv_port_attr
		if rc := C.dfkv_ibv_query_port(c, C.uint8_t(port), &pa); rc != 0 {
			return verbs.DeviceInfo{}, nil, fmt.Errorf("ibverbs: query %s port %d: %s", name, port, errnoText(rc))
		}
		pi := verbs.PortInfo{
			Num: uint8(port), State: verbs.PortState(pa.state), PhysState: verbs.PhysState(pa.phys_state),
			LID: uint16(pa.lid), MTU: mtuBytes[pa.active_mtu], LinkLayer: "InfiniBand",
		}
		if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
			pi.LinkLayer = "Ethernet"
		}
		var gid [16]C.uint8_t
		if C.dfkv_ibv_query_gid(c, C.uint8_t(port), 0, &gid[0]) == 0 {
			for j := range gid {
				pi.GID[j] = byte(gid[j])
			}
		}
		info.Ports = append(info.Ports, pi)
		tblLen = append(tblLen, int(pa.gid_tbl_len))
	}
	return info, tblLen, nil
}

// Open implements verbs.Provider.
func (p *Provider) Open(name string) (verbs.Context, error) {
	l, n, err := p.deviceList()
	if err != nil {
		return nil, err
	}
	defer C.dfkv_ibv_free_device_list(l)
	for i := range n {
		d := devAt(l, i)
		if C.GoString(C.dfkv_ibv_get_device_name(d)) != name {
			continue
		}
		var e C.int
		c := C.dfkv_ibv_open_device(d, &e)
		if c == nil {
			return nil, fmt.Errorf("ibverbs: open %s: %s", name, errnoText(e))
		}
		info, tbl, err := p.queryTables(c, name)
		if err != nil {
			C.dfkv_ibv_close_device(c)
			return nil, err
		}
		return &devContext{c: c, info: info, gidTblLen: tbl, sysClass: p.opt.SysClass}, nil
	}
	return nil, fmt.Errorf("%w: ibverbs: no device named %q", verbs.ErrNoDevice, name)
}

type devContext struct {
	c         *C.struct_ibv_context
	info      verbs.DeviceInfo
	gidTblLen []int // per port (index port-1): ibv_port_attr.gid_tbl_len
	sysClass  string
}

func (d *devContext) Info() verbs.DeviceInfo { return d.info }

// PortState implements verbs.PortStater: ibv_query_port now. Soft-RoCE reports a port
// taken down by `ip link set … down` only here (its QPs get no event), so a connection
// asks while a completion is late.
func (d *devContext) PortState(port uint8) (verbs.PortState, error) {
	if port == 0 || int(port) > len(d.gidTblLen) {
		return 0, fmt.Errorf("%w: %s has no port %d", verbs.ErrInvalid, d.info.Name, port)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.dfkv_ibv_query_port(d.c, C.uint8_t(port), &pa); rc != 0 {
		return 0, fmt.Errorf("ibverbs: query %s port %d: %s", d.info.Name, port, errnoText(rc))
	}
	return verbs.PortState(pa.state), nil
}

// GIDTable implements verbs.Context: ibv_query_gid_table (one call, types included) where
// the library has it, else sysfs. Read per connection: addresses come and go at run time.
func (d *devContext) GIDTable(port uint8) ([]verbs.GIDEntry, error) {
	if port == 0 || int(port) > len(d.gidTblLen) {
		return nil, fmt.Errorf("%w: %s has no port %d", verbs.ErrInvalid, d.info.Name, port)
	}
	total := 0
	for _, n := range d.gidTblLen {
		total += n
	}
	total = min(max(total, 1), 1<<16)
	buf := make([]C.struct_dfkv_gid, total)
	n := int(C.dfkv_ibv_query_gid_table(d.c, &buf[0], C.long(total)))
	if n < 0 { // ENOSYS: a library before rdma-core 29; else a kernel without the ioctl
		t, err := sysfsGIDTable(d.sysClass, d.info.Name, port, d.gidTblLen[port-1])
		if err != nil {
			return nil, fmt.Errorf("ibverbs: query_gid_table on %s: %s; %w", d.info.Name, errnoText(C.int(-n)), err)
		}
		return t, nil
	}
	var out []verbs.GIDEntry
	for _, e := range buf[:n] {
		if uint8(e.port) != port {
			continue
		}
		g := verbs.GIDEntry{Index: int(e.index), Type: gidTypeOf(uint32(e._type))}
		for j := range g.GID {
			g.GID[j] = byte(e.gid[j])
		}
		if e.ifindex != 0 {
			if ifc, err := net.InterfaceByIndex(int(e.ifindex)); err == nil {
				g.NetDev = ifc.Name
			}
		}
		out = append(out, g)
	}
	return out, nil
}

func (d *devContext) AllocPD() (verbs.PD, error) {
	var e C.int
	pd := C.dfkv_ibv_alloc_pd(d.c, &e)
	if pd == nil {
		return nil, fmt.Errorf("ibverbs: alloc_pd on %s: %s", d.info.Name, errnoText(e))
	}
	return &protDomain{pd: pd, ctx: d}, nil
}

func (d *devContext) CreateCQ(depth int) (verbs.CQ, error) {
	if depth <= 0 || (d.info.MaxCQE > 0 && depth > d.info.MaxCQE) {
		return nil, fmt.Errorf("%w: cq depth %d (max %d)", verbs.ErrInvalid, depth, d.info.MaxCQE)
	}
	var e C.int
	ch := C.dfkv_ibv_create_comp_channel(d.c, &e)
	if ch == nil {
		return nil, fmt.Errorf("ibverbs: completion channel on %s: %s", d.info.Name, errnoText(e))
	}
	cq := C.dfkv_ibv_create_cq(d.c, C.int(depth), ch, &e)
	if cq == nil {
		C.dfkv_ibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("ibverbs: create_cq(%d) on %s: %s", depth, d.info.Name, errnoText(e))
	}
	return &complQueue{cq: cq, ch: ch, fd: int(C.dfkv_ibv_comp_fd(ch))}, nil
}

func (d *devContext) Close() error {
	if rc := C.dfkv_ibv_close_device(d.c); rc != 0 {
		return fmt.Errorf("ibverbs: close %s: %s", d.info.Name, errnoText(rc))
	}
	return nil
}

type protDomain struct {
	pd  *C.struct_ibv_pd
	ctx *devContext
}

func (p *protDomain) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: register 0 bytes", verbs.ErrInvalid)
	}
	// The address crosses as an integer: the memory must be outside the Go heap (see doc).
	addr := uintptr(unsafe.Pointer(&buf[0]))
	var e C.int
	m := C.dfkv_ibv_reg_mr(p.pd, C.uintptr_t(addr), C.size_t(len(buf)), C.int(access), &e)
	if m == nil {
		return nil, regMRError(len(buf), syscall.Errno(e), verbs.Memlock())
	}
	return &memRegion{mr: m, buf: buf, n: len(buf), access: access}, nil
}

// RegDMABuf registers device memory through ibv_reg_dmabuf_mr (rdma-core >= 34, a kernel
// and driver that import DMA-BUFs: rxe answers EOPNOTSUPP). The MR has no host bytes.
func (p *protDomain) RegDMABuf(fd int, offset, size, iova uint64, access verbs.Access) (verbs.MR, error) {
	if fd < 0 || size == 0 || iova == 0 || iova+size < iova || size > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("%w: register dmabuf fd %d, %d bytes at iova %#x", verbs.ErrInvalid, fd, size, iova)
	}
	var e C.int
	m := C.dfkv_ibv_reg_dmabuf_mr(p.pd, C.uint64_t(offset), C.size_t(size), C.uint64_t(iova), C.int(fd), C.int(access), &e)
	if m == nil {
		return nil, regDMABufError(size, int(e))
	}
	return &memRegion{mr: m, n: int(size), access: access}, nil
}

func (p *protDomain) CreateQP(cfg verbs.QPConfig) (verbs.QP, error) {
	if cfg.Type != verbs.QPTypeRC {
		return nil, fmt.Errorf("%w: qp type %d (only RC)", verbs.ErrInvalid, cfg.Type)
	}
	scq, ok1 := cfg.SendCQ.(*complQueue)
	rcq, ok2 := cfg.RecvCQ.(*complQueue)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: CQ from another provider", verbs.ErrInvalid)
	}
	sig := C.int(0)
	if cfg.SignalAll {
		sig = 1
	}
	var e C.int
	q := C.dfkv_ibv_create_qp(p.pd, scq.cq, rcq.cq, C.uint32_t(cfg.MaxSendWR), C.uint32_t(cfg.MaxRecvWR),
		C.uint32_t(cfg.MaxSendSGE), C.uint32_t(cfg.MaxRecvSGE), sig, &e)
	if q == nil {
		return nil, fmt.Errorf("ibverbs: create_qp: %s", errnoText(e))
	}
	return &queuePair{qp: q, global: p.ctx.info}, nil
}

func (p *protDomain) Close() error {
	if rc := C.dfkv_ibv_dealloc_pd(p.pd); rc != 0 {
		return fmt.Errorf("ibverbs: dealloc_pd: %s", errnoText(rc))
	}
	return nil
}

type memRegion struct {
	mr     *C.struct_ibv_mr
	buf    []byte // nil for a DMA-BUF
	n      int
	access verbs.Access
}

func (m *memRegion) Addr() uint64         { return uint64(uintptr(m.mr.addr)) }
func (m *memRegion) Len() int             { return m.n }
func (m *memRegion) LKey() uint32         { return uint32(m.mr.lkey) }
func (m *memRegion) RKey() uint32         { return uint32(m.mr.rkey) }
func (m *memRegion) Access() verbs.Access { return m.access }
func (m *memRegion) Bytes() []byte        { return m.buf }
func (m *memRegion) Close() error {
	if rc := C.dfkv_ibv_dereg_mr(m.mr); rc != 0 {
		return fmt.Errorf("ibverbs: dereg_mr: %s", errnoText(rc))
	}
	return nil
}

type complQueue struct {
	cq *C.struct_ibv_cq
	ch *C.struct_ibv_comp_channel
	fd int

	mu     sync.Mutex
	stash  []verbs.WorkCompletion // polled by Wait, handed out by Poll first
	closed bool
}

func (c *complQueue) pollLocked(wcs []verbs.WorkCompletion) int {
	n := copy(wcs, c.stash)
	c.stash = c.stash[:copy(c.stash, c.stash[n:])]
	var buf [32]C.struct_dfkv_wc
	for n < len(wcs) {
		want := min(len(wcs)-n, len(buf))
		got := int(C.dfkv_ibv_poll_cq(c.cq, C.int(want), &buf[0]))
		for i := range max(got, 0) {
			w := buf[i]
			wcs[n] = verbs.WorkCompletion{ID: uint64(w.id), Status: verbs.WCStatus(w.status), Opcode: verbs.WCOpcode(w.opcode),
				ByteLen: uint32(w.byte_len), Imm: uint32(w.imm), HasImm: w.with_imm != 0, QPNum: uint32(w.qp_num)}
			n++
		}
		if got < want {
			break
		}
	}
	return n
}

func (c *complQueue) Poll(wcs []verbs.WorkCompletion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, verbs.ErrClosed
	}
	return c.pollLocked(wcs), nil
}

// Wait arms the CQ, then polls once (a completion may have landed before arming), then
// sleeps on the completion channel's fd. The fd is polled in short slices so that ctx and
// Close are noticed.
func (c *complQueue) Wait(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return verbs.ErrClosed
	}
	if len(c.stash) > 0 {
		c.mu.Unlock()
		return nil
	}
	if rc := C.dfkv_ibv_req_notify(c.cq); rc != 0 {
		c.mu.Unlock()
		return fmt.Errorf("ibverbs: req_notify_cq: %s", errnoText(rc))
	}
	var one [1]verbs.WorkCompletion
	if c.pollLocked(one[:]) == 1 {
		c.stash = append(c.stash, one[0])
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int((50 * time.Millisecond).Milliseconds()))
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("ibverbs: poll completion channel: %w", err)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return verbs.ErrClosed
		}
		if n > 0 {
			var e C.int
			C.dfkv_ibv_cq_event(c.ch, &e)
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
	}
}

func (c *complQueue) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if rc := C.dfkv_ibv_destroy_cq(c.cq); rc != 0 {
		return fmt.Errorf("ibverbs: destroy_cq: %s", errnoText(rc))
	}
	if rc := C.dfkv_ibv_destroy_comp_channel(c.ch); rc != 0 {
		return fmt.Errorf("ibverbs: destroy_comp_channel: %s", errnoText(rc))
	}
	return nil
}

type queuePair struct {
	qp     *C.struct_ibv_qp
	global verbs.DeviceInfo
	mu     sync.Mutex
	port   uint8
	state  verbs.QPState
}

func (q *queuePair) Num() uint32 { return uint32(q.qp.qp_num) }

func (q *queuePair) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *queuePair) Modify(a verbs.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := verbs.CheckTransition(q.state, a.State); err != nil {
		return err
	}
	var rc C.int
	switch a.State {
	case verbs.QPInit:
		rc = C.dfkv_ibv_modify_init(q.qp, C.uint8_t(a.PortNum), C.int(a.Access))
		if rc == 0 {
			q.port = a.PortNum
		}
	case verbs.QPRTR:
		var gid [16]C.uint8_t
		for i := range gid {
			gid[i] = C.uint8_t(a.RemoteGID[i])
		}
		global := C.int(0)
		if !a.RemoteGID.IsZero() {
			global = 1 // RoCE always, InfiniBand across subnets
		}
		hop := a.Path.HopLimit
		if hop == 0 {
			hop = verbs.DefaultHopLimit
		}
		rc = C.dfkv_ibv_modify_rtr(q.qp, C.uint8_t(q.port), mtuEnum(a.PathMTU), C.uint32_t(a.DestQPNum),
			C.uint32_t(a.RQPSN&0xffffff), &gid[0], C.uint16_t(a.RemoteLID), global,
			C.uint8_t(a.Path.SGIDIndex), C.uint8_t(hop), C.uint8_t(a.Path.TrafficClass))
	case verbs.QPRTS:
		rc = C.dfkv_ibv_modify_rts(q.qp, C.uint32_t(a.SQPSN&0xffffff), C.uint8_t(a.Timeout), C.uint8_t(a.RetryCount), C.uint8_t(a.RNRRetry))
	default:
		rc = C.dfkv_ibv_modify_state(q.qp, C.int(a.State))
	}
	if rc != 0 {
		return fmt.Errorf("ibverbs: modify qp %d to %s: %s", q.Num(), a.State, errnoText(rc))
	}
	q.state = a.State
	return nil
}

func postErr(op string, rc C.int) error {
	if syscall.Errno(rc) == syscall.ENOMEM {
		return fmt.Errorf("%w: %s: %s", verbs.ErrQueueFull, op, errnoText(rc))
	}
	return fmt.Errorf("%w: %s: %s", verbs.ErrInvalid, op, errnoText(rc))
}

func (q *queuePair) PostSend(wrs []verbs.SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	flat := make([]C.struct_dfkv_swr, len(wrs))
	var sges []C.struct_ibv_sge
	for i, wr := range wrs {
		flat[i] = C.struct_dfkv_swr{id: C.uint64_t(wr.ID), raddr: C.uint64_t(wr.RemoteAddr), rkey: C.uint32_t(wr.RKey),
			imm: C.uint32_t(wr.Imm), opcode: C.uint32_t(wr.Opcode), flags: C.uint32_t(wr.Flags),
			nsge: C.uint32_t(len(wr.SGL)), sge_off: C.uint32_t(len(sges))}
		for _, s := range wr.SGL {
			sges = append(sges, C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)})
		}
	}
	var sp *C.struct_ibv_sge
	if len(sges) > 0 {
		sp = &sges[0]
	}
	var bad C.int
	if rc := C.dfkv_ibv_post_send(q.qp, &flat[0], C.int(len(flat)), sp, &bad); rc != 0 {
		return int(bad), postErr("post_send", rc)
	}
	return len(wrs), nil
}

func (q *queuePair) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	flat := make([]C.struct_dfkv_rwr, len(wrs))
	var sges []C.struct_ibv_sge
	for i, wr := range wrs {
		flat[i] = C.struct_dfkv_rwr{id: C.uint64_t(wr.ID), nsge: C.uint32_t(len(wr.SGL)), sge_off: C.uint32_t(len(sges))}
		for _, s := range wr.SGL {
			sges = append(sges, C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)})
		}
	}
	var sp *C.struct_ibv_sge
	if len(sges) > 0 {
		sp = &sges[0]
	}
	var bad C.int
	if rc := C.dfkv_ibv_post_recv(q.qp, &flat[0], C.int(len(flat)), sp, &bad); rc != 0 {
		return int(bad), postErr("post_recv", rc)
	}
	return len(wrs), nil
}

func (q *queuePair) Close() error {
	if rc := C.dfkv_ibv_destroy_qp(q.qp); rc != 0 {
		return fmt.Errorf("ibverbs: destroy_qp: %s", errnoText(rc))
	}
	return nil
}

// abiValue is one size or offset of the verbs ABI (abi_fields.h).
type abiValue struct {
	name       string
	ours, real uint64
	enum       bool
}

// abiLayout pairs verbs_abi.h's sizes, offsets and enum values with those of rdma-core's
// installed header; ok is false where the header is not installed.
func abiLayout() (vals []abiValue, ok bool) {
	var ours, real [256]C.size_t
	no := int(C.dfkv_abi_ours(&ours[0], C.size_t(len(ours))))
	nr := int(C.dfkv_abi_real(&real[0], C.size_t(len(real))))
	if nr == 0 {
		return nil, false
	}
	for i := range max(no, nr) {
		v := abiValue{name: C.GoString(C.dfkv_abi_name(C.size_t(i)))}
		if i < no {
			v.ours = uint64(ours[i])
		}
		if i < nr {
			v.real = uint64(real[i])
		}
		vals = append(vals, v)
	}
	var oe, re [64]C.long
	ne := int(C.dfkv_abi_our_enums(&oe[0], C.size_t(len(oe))))
	nre := int(C.dfkv_abi_real_enums(&re[0], C.size_t(len(re))))
	for i := range max(ne, nre) {
		v := abiValue{name: fmt.Sprintf("enum value %d", i), enum: true}
		if i < ne {
			v.ours = uint64(oe[i])
		}
		if i < nre {
			v.real = uint64(re[i])
		}
		vals = append(vals, v)
	}
	return vals, true
}
