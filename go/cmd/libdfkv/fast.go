package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "fastget.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/cabi"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// The Go half of the GET fast path (fastget.c serves dfkv_get and dfkv_get_auto in C). This
// side registers a client with the C side, publishes its routing snapshot whenever the
// membership's view changes, hands the C side greeted sockets and takes back its failures,
// and moves the figures of the GETs served there into the client's metrics.
// DFKV_CABI_FASTPATH=0 turns it off (every GET then enters Go, as before).

// fastTick is how often a client's view is compared with the one the C side routes by, and
// the C side's figures are moved into the client's metrics. A membership change reaches the
// fast path within it (the MDS watch itself takes longer); stats snapshots take the figures
// at once.
const fastTick = 50 * time.Millisecond

type fastState struct {
	id C.uintptr_t
	c  *client.Client

	mu    sync.Mutex // guards uids and addrs
	uids  map[string]uint32
	addrs []string

	flushMu sync.Mutex // one taker of the C side's figures at a time
	lat     []C.uint64_t

	stop chan struct{}
	done chan struct{}
}

var fastClients sync.Map // C.uintptr_t -> *fastState

func fastLookup(id C.uintptr_t) *fastState {
	if v, ok := fastClients.Load(id); ok {
		return v.(*fastState)
	}
	return nil
}

// fastOpen registers the client behind id with the C side when it can use the fast path.
func fastOpen(id C.uintptr_t, h *cabi.Handle) {
	if os.Getenv("DFKV_CABI_FASTPATH") == "0" {
		return
	}
	c := h.Client()
	info, ok := c.Detachable()
	if !ok {
		return
	}
	if why := fastUnavailable(); why != "" {
		slog.Info("dfkv: C ABI GET fast path off", "reason", why)
		return
	}
	req, resp := fastProbes(info.Tenant)
	rc := fastRegister(uint64(id), info, req[:], resp[:])
	if rc != 0 {
		why := fmt.Sprintf("registration refused (%d)", int(rc))
		if rc == -3 || rc == -4 {
			why = "header layout differs from the generated code"
		} else if rc == -2 {
			why = "namespace too long"
		}
		slog.Warn("dfkv: C ABI GET fast path off", "reason", why)
		return
	}
	st := &fastState{id: id, c: c, uids: map[string]uint32{}, lat: make([]C.uint64_t, 4096),
		stop: make(chan struct{}), done: make(chan struct{})}
	fastClients.Store(id, st)
	h.SetOnPeerCooldown(st.cooled)
	v := c.View() // published before the first call can come
	st.publish(v)
	go st.run(v)
}

// fastUnavailable says why the fast path cannot run in this process ("" when it can).
func fastUnavailable() string { return C.GoString(C.dfkvc_fast_unavailable()) }

// fastProbes encodes, with the generated code, the request and reply headers that
// fastget.c must write and read byte for byte before it serves a client.
func fastProbes(tenant uint64) (req [wire.RequestSize]byte, resp [wire.ResponseSize]byte) {
	(&wire.Request{Op: fb.OpGet, Flags: wire.FlagCap, Tenant: tenant,
		ID:     identity.ObjectID{Hi: 0x0102030405060708, Lo: 0x1112131415161718},
		Offset: 0x2122232425262728, Length: 0x3132333435363738, PayloadLen: 0x4142434445464748}).Encode(req[:])
	(&wire.Response{Op: fb.OpGet, Status: fb.StatusNotFound, ValueLen: 0x5152535455565758,
		PayloadLen: 0x6162636465666768}).Encode(resp[:])
	return req, resp
}

// fastRegister hands a client to the C side: 0, or why not (-3: the request probe differs
// from what fastget.c encodes, -4: it reads the reply probe otherwise; see fastget.c).
func fastRegister(id uint64, info client.DetachedInfo, req, resp []byte) int {
	if len(req) != wire.RequestSize || len(resp) != wire.ResponseSize {
		return -3
	}
	miss := client.ErrNotFound.Error()
	var ns unsafe.Pointer
	if len(info.Namespace) > 0 {
		ns = unsafe.Pointer(&info.Namespace[0])
	}
	return int(C.dfkvc_fast_register(C.uintptr_t(id), C.uint64_t(info.Tenant), ns, C.size_t(len(info.Namespace)),
		C.longlong(info.IOTimeout.Nanoseconds()), C.int(info.PoolSize), C.unsigned(wire.MaxStatus),
		(*C.char)(unsafe.Pointer(unsafe.StringData(miss))), C.size_t(len(miss)),
		unsafe.Pointer(&req[0]), unsafe.Pointer(&resp[0])))
}

// fastClose unregisters id: the C side stops serving it (calls in flight finish on their
// own sockets), and its last figures reach the client's metrics.
func fastClose(id uint64) {
	if v, ok := fastClients.LoadAndDelete(C.uintptr_t(id)); ok {
		st := v.(*fastState)
		close(st.stop)
		<-st.done
		st.flush()
	}
	C.dfkvc_fast_close(C.uintptr_t(id)) // a no-op for an id the C side does not hold
}

// run republishes the view when it changes (last: the one published) and moves the figures,
// every fastTick until fastClose.
func (st *fastState) run(last *client.View) {
	defer close(st.done)
	t := time.NewTicker(fastTick)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			return
		case <-t.C:
		}
		if v := st.c.View(); v != last {
			st.publish(v)
			last = v
		}
		st.flush()
	}
}

// uid names a member's address for the C side; an address keeps its uid for the life of
// the client, so a member that leaves and returns finds its slot again.
func (st *fastState) uid(addr string) uint32 {
	st.mu.Lock()
	defer st.mu.Unlock()
	u, ok := st.uids[addr]
	if !ok {
		u = uint32(len(st.addrs))
		st.uids[addr] = u
		st.addrs = append(st.addrs, addr)
	}
	return u
}

func (st *fastState) addr(uid C.uint32_t) (string, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if int(uid) >= len(st.addrs) {
		return "", false
	}
	return st.addrs[uid], true
}

// publish hands the C side v's ring; a nil or empty view leaves it no route (every GET
// goes through Go, which reports the empty ring).
func (st *fastState) publish(v *client.View) {
	var hashes []uint64
	var nodes []int32
	var uids []uint32
	if v != nil && v.Ring != nil {
		hashes, nodes = v.Ring.Points()
		uids = make([]uint32, len(v.Members))
		for i, m := range v.Members {
			uids[i] = st.uid(m.Addr)
		}
	}
	var hp, np, up unsafe.Pointer
	if len(hashes) > 0 {
		hp, np = unsafe.Pointer(&hashes[0]), unsafe.Pointer(&nodes[0])
	}
	if len(uids) > 0 {
		up = unsafe.Pointer(&uids[0])
	}
	C.dfkvc_fast_set_view(st.id, (*C.uint64_t)(hp), (*C.int32_t)(np), C.int(len(hashes)),
		(*C.uint32_t)(up), C.int(len(uids)))
}

// cooled is the client's OnPeerCooldown: the C side stops using addr until the cool-down
// ends and drops its idle sockets to it.
func (st *fastState) cooled(addr string, until time.Time) {
	st.mu.Lock()
	u, ok := st.uids[addr]
	st.mu.Unlock()
	if ok {
		C.dfkvc_fast_cool(st.id, C.uint32_t(u), C.longlong(until.UnixNano()))
	}
}

// flush moves the figures of the GETs the C side served into the client's metrics.
func (st *fastState) flush() {
	st.flushMu.Lock()
	defer st.flushMu.Unlock()
	var lats []time.Duration
	for {
		var hits, misses, bytes C.uint64_t
		n := int(C.dfkvc_fast_take(st.id, &st.lat[0], C.size_t(len(st.lat)), &hits, &misses, &bytes))
		lats = lats[:0]
		for _, l := range st.lat[:n] {
			lats = append(lats, time.Duration(l))
		}
		st.c.RecordDetachedGets(uint64(hits), uint64(misses), uint64(bytes), lats)
		if n < len(st.lat) {
			return
		}
	}
}

// fastStats renders the fast path's figures for the stats snapshot (Prometheus text).
func fastStats(b []byte, id C.uintptr_t) []byte {
	var gets, fallbacks, dials, conns, members C.uint64_t
	enabled := 0
	if fastLookup(id) != nil {
		enabled = 1
		C.dfkvc_fast_counts(id, &gets, &fallbacks, &dials, &conns, &members)
	}
	return fmt.Appendf(b, "# HELP dfkv_cabi_fast_enabled Whether dfkv_get and dfkv_get_auto are served in C (1) or always through Go (0).\n"+
		"# TYPE dfkv_cabi_fast_enabled gauge\ndfkv_cabi_fast_enabled %d\n"+
		"# HELP dfkv_cabi_fast_gets_total GETs answered wholly in C: hits, misses and timeouts.\n"+
		"# TYPE dfkv_cabi_fast_gets_total counter\ndfkv_cabi_fast_gets_total %d\n"+
		"# HELP dfkv_cabi_fast_fallbacks_total GETs the C side handed to the Go client: a status it does not handle, a broken or new stream that failed, a peer cooling down, a socket that could not be dialed.\n"+
		"# TYPE dfkv_cabi_fast_fallbacks_total counter\ndfkv_cabi_fast_fallbacks_total %d\n"+
		"# HELP dfkv_cabi_fast_dials_total Sockets the Go client dialed and handed to the C side.\n"+
		"# TYPE dfkv_cabi_fast_dials_total counter\ndfkv_cabi_fast_dials_total %d\n"+
		"# HELP dfkv_cabi_fast_conns Sockets the C side holds (idle and in use).\n"+
		"# TYPE dfkv_cabi_fast_conns gauge\ndfkv_cabi_fast_conns %d\n"+
		"# HELP dfkv_cabi_fast_ring_members Members of the ring the C side routes by (the client's view, published within 50 ms of a change).\n"+
		"# TYPE dfkv_cabi_fast_ring_members gauge\ndfkv_cabi_fast_ring_members %d\n",
		enabled, uint64(gets), uint64(fallbacks), uint64(dials), uint64(conns), uint64(members))
}

//export dfkvgo_fast_dial
func dfkvgo_fast_dial(id C.uintptr_t, uid C.uint32_t) (fd C.int) {
	defer func() {
		if r := recover(); r != nil {
			fd = -1
			_ = cabi.Recovered(r, debug.Stack())
		}
	}()
	st := fastLookup(id)
	if st == nil {
		return -1
	}
	addr, ok := st.addr(uid)
	if !ok {
		return -1
	}
	n, err := st.c.DialDetached(addr)
	if err != nil {
		return -1 // the Go path serves the call, and says why if it fails too
	}
	return C.int(n)
}

//export dfkvgo_fast_failed
func dfkvgo_fast_failed(id C.uintptr_t, uid C.uint32_t, elapsedNS C.longlong) {
	defer func() {
		if r := recover(); r != nil {
			setError(id, cabi.Recovered(r, debug.Stack()))
		}
	}()
	st := fastLookup(id)
	if st == nil {
		setError(id, fmt.Errorf("dfkv: get: %w", os.ErrDeadlineExceeded))
		return
	}
	addr, _ := st.addr(uid)
	setError(id, st.c.DetachedGetFailed(addr, os.ErrDeadlineExceeded, time.Duration(elapsedNS)))
}
