// Command libdfkv builds libdfkv.so, the dfkv C ABI v2 (dfkv.h):
//
//	go build -buildmode=c-shared -o libdfkv.so ./go/cmd/libdfkv
//
// The public dfkv_* symbols are thin C functions in dfkv_abi.c, compiled against the
// checked-in dfkv.h so the header is the contract the compiler enforces. They call the Go
// exports below (dfkvgo_*), which only turn C pointers into Go slices for the duration of
// the call and hand off to package cabi. Every export runs its body through call(): a Go
// panic never crosses into C (it becomes the failure return, is counted and logged once),
// and the reason of every failure is kept for dfkv_last_error.
package main

/*
#cgo CFLAGS: -O2 -Wall
#include <stdint.h>
#include <stdlib.h>
#include "dfkv.h"
void dfkvc_set_error(uintptr_t c, const char* msg, size_t n, int status);
int dfkvc_caller_threads(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/cabi"
)

func main() {}

// maxKey bounds a key length so that a garbage length cannot make Go touch gigabytes of C
// memory; real keys are far smaller.
const maxKey = 1 << 24

// maxItems bounds a batch's n.
const maxItems = 1 << 20

var (
	errHandle = errors.New("dfkv: NULL, closed or unknown client handle")
	errArg    = errors.New("dfkv: bad argument (NULL pointer, oversized key or length, or n out of range)")
)

func handle(c C.uintptr_t) *cabi.Handle { return cabi.Lookup(uint64(c)) }

// setError keeps err as the calling thread's last error on handle c (dfkv_last_error) with
// its status code (dfkv_last_status). The export runs on the C caller's own thread, so the C
// side's thread-local storage is that caller's.
func setError(c C.uintptr_t, err error) {
	setErrorStatus(c, err, errStatus(err))
}

func setErrorStatus(c C.uintptr_t, err error, status int) {
	msg := err.Error()
	C.dfkvc_set_error(c, (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)), C.int(status))
}

// cabi's status codes are dfkv.h's: a difference is a constant index out of range, which
// does not compile.
func _() {
	var x [1]struct{}
	_ = x[C.DFKV_STATUS_OK-cabi.StatusOK]
	_ = x[C.DFKV_STATUS_NOT_FOUND-cabi.StatusNotFound]
	_ = x[C.DFKV_STATUS_UNAVAILABLE-cabi.StatusUnavailable]
	_ = x[C.DFKV_STATUS_TIMEOUT-cabi.StatusTimeout]
	_ = x[C.DFKV_STATUS_FORBIDDEN-cabi.StatusForbidden]
	_ = x[C.DFKV_STATUS_TOO_LARGE-cabi.StatusTooLarge]
	_ = x[C.DFKV_STATUS_BUFFER_TOO_SMALL-cabi.StatusBufferTooSmall]
	_ = x[C.DFKV_STATUS_CACHE_FULL-cabi.StatusCacheFull]
	_ = x[C.DFKV_STATUS_QUOTA_EXCEEDED-cabi.StatusQuotaExceeded]
	_ = x[C.DFKV_STATUS_BUSY-cabi.StatusBusy]
	_ = x[C.DFKV_STATUS_IO_ERROR-cabi.StatusIOError]
	_ = x[C.DFKV_STATUS_INVALID-cabi.StatusInvalid]
	_ = x[C.DFKV_STATUS_PROTOCOL-cabi.StatusProtocol]
	_ = x[C.DFKV_STATUS_CLOSED-cabi.StatusClosed]
	_ = x[C.DFKV_STATUS_INTERNAL-cabi.StatusInternal]
}

// errStatus: this layer's own refusals, then the client's sentinels (cabi.Status).
func errStatus(err error) int {
	switch {
	case errors.Is(err, errHandle):
		return cabi.StatusClosed
	case errors.Is(err, errArg):
		return cabi.StatusInvalid
	}
	return cabi.Status(err)
}

// call is every export's prologue and epilogue: it looks up the handle, runs body, turns a
// panic into the failure code fail, and records why for dfkv_last_error whenever body
// reports an error.
func call[T any](c C.uintptr_t, fail T, body func(h *cabi.Handle) (T, error)) (rc T) {
	defer func() {
		if r := recover(); r != nil {
			rc = fail
			setError(c, cabi.Recovered(r, debug.Stack()))
		}
	}()
	h := handle(c)
	if h == nil {
		setError(c, errHandle)
		return fail
	}
	rc, err := body(h)
	if err != nil {
		setError(c, err)
	}
	return rc
}

func bytesOf(p unsafe.Pointer, n C.uint64_t) ([]byte, bool) {
	if n == 0 {
		return []byte{}, true
	}
	if p == nil || uint64(n) > 1<<40 {
		return nil, false
	}
	return unsafe.Slice((*byte)(p), int(n)), true
}

func keyOf(p unsafe.Pointer, n C.uint64_t) ([]byte, bool) {
	if uint64(n) > maxKey {
		return nil, false
	}
	return bytesOf(p, n)
}

func cstr(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

//export dfkvgo_open_v2
func dfkvgo_open_v2(o *C.dfkv_client_options_v2) (id C.uintptr_t) {
	defer func() {
		if r := recover(); r != nil {
			id = 0
			setError(0, cabi.Recovered(r, debug.Stack()))
		}
	}()
	if o == nil {
		setErrorStatus(0, errors.New("dfkv_open_v2: NULL options"), cabi.StatusInvalid)
		return 0
	}
	// Read struct_size first: a caller with an older, shorter struct must not make us read
	// past its end.
	size := uint32(o.struct_size)
	if size < cabi.OptionsSize {
		setErrorStatus(0, errors.New("dfkv_open_v2: struct_size smaller than dfkv_client_options_v2"), cabi.StatusInvalid)
		return 0
	}
	ns, ok := bytesOf(o.key_namespace, o.key_namespace_len)
	if !ok {
		setErrorStatus(0, errors.New("dfkv_open_v2: NULL key_namespace with a nonzero length"), cabi.StatusInvalid)
		return 0
	}
	opts := &cabi.Options{
		StructSize: size, ABIVersion: uint32(o.abi_version), Members: cstr(o.members),
		Namespace: append([]byte(nil), ns...), BatchConcurrency: uint64(o.batch_concurrency),
		MDSEndpoints: cstr(o.mds_endpoints), MDSGroup: cstr(o.mds_group), MDSPollMS: int32(o.mds_poll_ms),
		Flags: uint32(o.flags), ClientID: cstr(o.client_id), ClientInfo: cstr(o.client_info),
		ClientHeartbeatMS: int32(o.client_heartbeat_ms), Reserved0: uint32(o.reserved0),
	}
	id = C.uintptr_t(cabi.Open(opts))
	if id == 0 {
		setErrorStatus(0, errors.New("dfkv_open_v2: "+cabi.LastError()), cabi.StatusInvalid)
		return 0
	}
	fastOpen(id, handle(id))
	return id
}

//export dfkvgo_close
func dfkvgo_close(c C.uintptr_t) {
	defer func() {
		if r := recover(); r != nil {
			setError(c, cabi.Recovered(r, debug.Stack()))
		}
	}()
	fastClose(uint64(c))
	cabi.Close(uint64(c))
}

//export dfkvgo_put
func dfkvgo_put(c C.uintptr_t, key unsafe.Pointer, keyLen C.uint64_t, val unsafe.Pointer, n C.uint64_t) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		k, ok1 := keyOf(key, keyLen)
		v, ok2 := bytesOf(val, n)
		if !ok1 || !ok2 {
			return -1, errArg
		}
		rc, err := h.Put(k, v)
		return C.int(rc), err
	})
}

//export dfkvgo_get
func dfkvgo_get(c C.uintptr_t, key unsafe.Pointer, keyLen C.uint64_t, buf unsafe.Pointer, n C.uint64_t) C.int {
	return call(c, 0, func(h *cabi.Handle) (C.int, error) {
		k, ok1 := keyOf(key, keyLen)
		b, ok2 := bytesOf(buf, n)
		if !ok1 || !ok2 {
			return 0, errArg
		}
		rc, err := h.Get(k, b)
		return C.int(rc), err
	})
}

//export dfkvgo_get_auto
func dfkvgo_get_auto(c C.uintptr_t, key unsafe.Pointer, keyLen C.uint64_t, buf unsafe.Pointer, capacity C.uint64_t, outLen *C.uint64_t) C.int {
	if outLen != nil {
		*outLen = 0
	}
	return call(c, 0, func(h *cabi.Handle) (C.int, error) {
		k, ok1 := keyOf(key, keyLen)
		b, ok2 := bytesOf(buf, capacity)
		if !ok1 || !ok2 {
			return 0, errArg
		}
		rc, n, err := h.GetAuto(k, b)
		if outLen != nil {
			*outLen = C.uint64_t(n)
		}
		return C.int(rc), err
	})
}

//export dfkvgo_exist
func dfkvgo_exist(c C.uintptr_t, key unsafe.Pointer, keyLen C.uint64_t) C.int {
	return call(c, 0, func(h *cabi.Handle) (C.int, error) {
		k, ok := keyOf(key, keyLen)
		if !ok {
			return 0, errArg
		}
		rc, err := h.Exist(k)
		return C.int(rc), err
	})
}

//export dfkvgo_remove
func dfkvgo_remove(c C.uintptr_t, key unsafe.Pointer, keyLen C.uint64_t) C.int {
	return call(c, 0, func(h *cabi.Handle) (C.int, error) {
		k, ok := keyOf(key, keyLen)
		if !ok {
			return 0, errArg
		}
		rc, err := h.Remove(k)
		return C.int(rc), err
	})
}

// outs returns the per-item output slices, set to failure before anything else can fail.
func outs(n C.int, outOK *C.int, outLens *C.uint64_t) ([]int32, []uint64, bool) {
	if n < 0 || n > maxItems {
		return nil, nil, false
	}
	var ok []int32
	var lens []uint64
	if outOK != nil {
		ok = unsafe.Slice((*int32)(unsafe.Pointer(outOK)), int(n))
		for i := range ok {
			ok[i] = 0
		}
	}
	if outLens != nil {
		lens = unsafe.Slice((*uint64)(unsafe.Pointer(outLens)), int(n))
		for i := range lens {
			lens[i] = 0
		}
	}
	return ok, lens, outOK != nil
}

// keyList converts parallel key arrays.
func keyList(keys *unsafe.Pointer, keyLens *C.uint64_t, n C.int) ([][]byte, bool) {
	if n == 0 {
		return [][]byte{}, true
	}
	if keys == nil || keyLens == nil {
		return nil, false
	}
	ps := unsafe.Slice(keys, int(n))
	ls := unsafe.Slice(keyLens, int(n))
	out := make([][]byte, n)
	for i := range out {
		k, ok := keyOf(ps[i], ls[i])
		if !ok {
			return nil, false
		}
		out[i] = k
	}
	return out, true
}

func bufList(ptrs *unsafe.Pointer, lens *C.uint64_t, n C.int) ([][]byte, bool) {
	if n == 0 {
		return [][]byte{}, true
	}
	if ptrs == nil || lens == nil {
		return nil, false
	}
	ps := unsafe.Slice(ptrs, int(n))
	ls := unsafe.Slice(lens, int(n))
	out := make([][]byte, n)
	for i := range out {
		// A NULL or empty buffer makes only that item fail (cabi rejects empty values).
		b, ok := bytesOf(ps[i], ls[i])
		if !ok {
			b = []byte{}
		}
		out[i] = b
	}
	return out, true
}

func segList(segPtrs **unsafe.Pointer, segLens **C.uint64_t, counts *C.uint32_t, n C.int, maxSegs uint32) ([][][]byte, bool) {
	if n == 0 {
		return [][][]byte{}, true
	}
	if segPtrs == nil || segLens == nil || counts == nil {
		return nil, false
	}
	pp := unsafe.Slice(segPtrs, int(n))
	ll := unsafe.Slice(segLens, int(n))
	cc := unsafe.Slice(counts, int(n))
	out := make([][][]byte, n)
	for i := range out {
		cnt := uint32(cc[i])
		if cnt == 0 || cnt > maxSegs || pp[i] == nil || ll[i] == nil {
			out[i] = nil // the item fails; the rest go on
			continue
		}
		ps := unsafe.Slice(pp[i], int(cnt))
		ls := unsafe.Slice(ll[i], int(cnt))
		segs := make([][]byte, cnt)
		for j := range segs {
			b, ok := bytesOf(ps[j], ls[j])
			if !ok {
				segs = nil
				break
			}
			segs[j] = b
		}
		out[i] = segs
	}
	return out, true
}

// batch is the shared shape of the batch exports: outputs reset before anything can fail,
// then body with the converted keys.
func batch(c C.uintptr_t, n C.int, outOK *C.int, outLens *C.uint64_t, needLens bool, keys *unsafe.Pointer,
	keyLens *C.uint64_t, body func(h *cabi.Handle, ks [][]byte, ok []int32, lens []uint64) (int, error)) C.int {
	ok, lens, have := outs(n, outOK, outLens)
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		if !have || (needLens && lens == nil && n > 0) {
			return -1, errArg // n out of range or a NULL output array
		}
		ks, kok := keyList(keys, keyLens, n)
		if !kok {
			return -1, errArg
		}
		rc, err := body(h, ks, ok, lens)
		return C.int(rc), err
	})
}

//export dfkvgo_batch_put
func dfkvgo_batch_put(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, vals *unsafe.Pointer, valLens *C.uint64_t, n C.int, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		vs, good := bufList(vals, valLens, n)
		if !good {
			return -1, errArg
		}
		return h.BatchPut(ks, vs, ok)
	})
}

//export dfkvgo_batch_get
func dfkvgo_batch_get(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, bufs *unsafe.Pointer, lens *C.uint64_t, n C.int, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		bs, good := bufList(bufs, lens, n)
		if !good {
			return -1, errArg
		}
		return h.BatchGet(ks, bs, ok)
	})
}

//export dfkvgo_batch_get_auto
func dfkvgo_batch_get_auto(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, bufs *unsafe.Pointer, caps *C.uint64_t, n C.int, outOK *C.int, outLens *C.uint64_t) C.int {
	return batch(c, n, outOK, outLens, true, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, lens []uint64) (int, error) {
		bs, good := bufList(bufs, caps, n)
		if !good {
			return -1, errArg
		}
		return h.BatchGetAuto(ks, bs, ok, lens)
	})
}

//export dfkvgo_batch_exist
func dfkvgo_batch_exist(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, n C.int, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		return h.BatchExist(ks, ok)
	})
}

//export dfkvgo_batch_remove
func dfkvgo_batch_remove(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, n C.int, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		return h.BatchRemove(ks, ok)
	})
}

//export dfkvgo_batch_put_sg
func dfkvgo_batch_put_sg(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, segPtrs **unsafe.Pointer, segLens **C.uint64_t, counts *C.uint32_t, n C.int, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		ss, good := segList(segPtrs, segLens, counts, n, h.MaxSGSegs())
		if !good {
			return -1, errArg
		}
		return h.BatchPutSG(ks, ss, ok)
	})
}

//export dfkvgo_batch_get_auto_sg
func dfkvgo_batch_get_auto_sg(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, segPtrs **unsafe.Pointer, segLens **C.uint64_t, counts *C.uint32_t, n C.int, outOK *C.int, outLens *C.uint64_t) C.int {
	return batch(c, n, outOK, outLens, true, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, lens []uint64) (int, error) {
		ss, good := segList(segPtrs, segLens, counts, n, h.MaxSGSegs())
		if !good {
			return -1, errArg
		}
		return h.BatchGetAutoSG(ks, ss, ok, lens)
	})
}

//export dfkvgo_max_sg_segs
func dfkvgo_max_sg_segs(c C.uintptr_t) C.uint32_t {
	return call(c, 0, func(h *cabi.Handle) (C.uint32_t, error) { return C.uint32_t(h.MaxSGSegs()), nil })
}

//export dfkvgo_register_memory
func dfkvgo_register_memory(c C.uintptr_t, base unsafe.Pointer, size C.uint64_t) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		rc, err := h.RegisterMemory(base, uint64(size))
		return C.int(rc), err
	})
}

//export dfkvgo_unregister_memory
func dfkvgo_unregister_memory(c C.uintptr_t, base unsafe.Pointer, size C.uint64_t) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		rc, err := h.UnregisterMemory(base, uint64(size))
		return C.int(rc), err
	})
}

//export dfkvgo_register_dmabuf
func dfkvgo_register_dmabuf(c C.uintptr_t, fd C.int, offset, size, iova C.uint64_t) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		// A client with device memory registered never serves a GET in C: fastget.c reads
		// into the destination with the CPU, and a device destination must only ever be
		// written by RDMA. Off before the range exists, so no fast GET can target it.
		fastClose(uint64(c))
		rc, err := h.RegisterDMABuf(int(fd), uint64(offset), uint64(size), uint64(iova))
		return C.int(rc), err
	})
}

//export dfkvgo_unregister_dmabuf
func dfkvgo_unregister_dmabuf(c C.uintptr_t, iova, size C.uint64_t) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		rc, err := h.UnregisterDMABuf(uint64(iova), uint64(size))
		return C.int(rc), err
	})
}

// Static C strings for dfkv_transport_mode and dfkv_version: allocated once, never freed,
// so the pointers stay valid for the life of the process.
var (
	cEmpty   = C.CString("")
	cTCP     = C.CString("tcp")
	cRDMA    = C.CString("rdma")
	cClosed  = C.CString("closed")
	cVersion = C.CString(cabi.Version())
)

//export dfkvgo_transport_mode
func dfkvgo_transport_mode(c C.uintptr_t) *C.char {
	if c == 0 {
		return cEmpty // the original dfkv ABI's answer for NULL
	}
	return call(c, cClosed, func(h *cabi.Handle) (*C.char, error) {
		switch m := h.TransportMode(); m {
		case "rdma":
			return cRDMA, nil
		case "tcp":
			return cTCP, nil
		default:
			return modeString(m), nil
		}
	})
}

// "tcp(<reason>)" strings, interned: a few distinct reasons per process, kept for its life
// so the returned pointers stay valid.
var (
	modeMu      sync.Mutex
	modeStrings = map[string]*C.char{}
	cTCPOther   = C.CString("tcp(rdma not in use)")
)

func modeString(m string) *C.char {
	modeMu.Lock()
	defer modeMu.Unlock()
	if s, ok := modeStrings[m]; ok {
		return s
	}
	if len(modeStrings) >= 64 {
		return cTCPOther
	}
	s := C.CString(m)
	modeStrings[m] = s
	return s
}

//export dfkvgo_stats_snapshot
func dfkvgo_stats_snapshot(c C.uintptr_t, buf *C.char, capacity C.uint64_t) C.uint64_t {
	return call(c, 0, func(h *cabi.Handle) (C.uint64_t, error) {
		if st := fastLookup(c); st != nil {
			st.flush()
		}
		text := fastStats(h.StatsSnapshot(), c)
		if buf != nil && capacity > 0 {
			dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(min(uint64(capacity), uint64(len(text)))))
			copy(dst, text)
		}
		return C.uint64_t(len(text)), nil
	})
}

//export dfkvgo_version
func dfkvgo_version() *C.char { return cVersion }

//export dfkvgo_batch_exist_lease
func dfkvgo_batch_exist_lease(c C.uintptr_t, keys *unsafe.Pointer, keyLens *C.uint64_t, n C.int, leaseMS C.uint32_t, outOK *C.int) C.int {
	return batch(c, n, outOK, nil, false, keys, keyLens, func(h *cabi.Handle, ks [][]byte, ok []int32, _ []uint64) (int, error) {
		return h.BatchExistLease(ks, uint32(leaseMS), ok)
	})
}

//export dfkvgo_max_value_size
func dfkvgo_max_value_size(c C.uintptr_t) C.uint64_t {
	return call(c, 0, func(h *cabi.Handle) (C.uint64_t, error) {
		n, err := h.MaxValue()
		return C.uint64_t(n), err
	})
}

// dfkvgo_gomaxprocs and dfkvgo_yield serve dfkv_abi.c's caller tracking (see there).

func init() { cabi.CallerCount = func() int { return int(C.dfkvc_caller_threads()) } }

//export dfkvgo_gomaxprocs
func dfkvgo_gomaxprocs() C.int { return C.int(runtime.GOMAXPROCS(0)) }

//export dfkvgo_yield
func dfkvgo_yield() { cabi.Yield() }

// tagSize is the dfkv_block_tag this library was built with: a caller's struct_size must
// be at least that (the struct only grows at its end).
const tagSize = C.sizeof_dfkv_block_tag

func tagHash(p unsafe.Pointer, i int, bytesLen uint32, unsigned bool) client.BlockHash {
	if bytesLen > 0 {
		b := unsafe.Slice((*byte)(unsafe.Add(p, uintptr(i)*uintptr(bytesLen))), int(bytesLen))
		return client.BlockHash{Bytes: append([]byte(nil), b...)}
	}
	return client.BlockHash{Int: int64(*(*C.int64_t)(unsafe.Add(p, uintptr(i)*8))), Unsigned: unsigned}
}

//export dfkvgo_tag
func dfkvgo_tag(c C.uintptr_t, tags *C.dfkv_block_tag, n C.int) C.int {
	return call(c, -1, func(h *cabi.Handle) (C.int, error) {
		if n < 0 || n > maxItems || (n > 0 && tags == nil) {
			return -1, errArg
		}
		out := make([]client.Tag, int(n))
		for i, t := range unsafe.Slice(tags, int(n)) {
			if t.struct_size < tagSize || t.reserved0 != 0 || t.n_hashes == 0 || t.n_hashes > 1024 || t.hashes == nil {
				return -1, fmt.Errorf("dfkv_tag: tag %d: struct_size, reserved0 or hashes: %w", i, errArg)
			}
			var hl uint32
			unsigned := t.flags&C.DFKV_TAG_HASH_UINT64 != 0
			if t.flags&C.DFKV_TAG_HASH_BYTES != 0 {
				if unsigned {
					return -1, fmt.Errorf("dfkv_tag: tag %d: bytes and uint64 hashes: %w", i, errArg)
				}
				hl = uint32(t.hash_len)
				if hl == 0 || hl > 64 {
					return -1, fmt.Errorf("dfkv_tag: tag %d: hash_len %d: %w", i, hl, errArg)
				}
			} else if t.flags&^C.DFKV_TAG_HASH_UINT64 != 0 {
				return -1, fmt.Errorf("dfkv_tag: tag %d: unknown flags %#x: %w", i, uint32(t.flags), errArg)
			}
			k, ok := keyOf(t.key, t.key_len)
			if !ok || t.n_tokens > 1<<16 || (t.n_tokens > 0 && t.token_ids == nil) {
				return -1, fmt.Errorf("dfkv_tag: tag %d: key or token ids: %w", i, errArg)
			}
			ct := client.Tag{Key: append([]byte(nil), k...), Model: cstr(t.model), BlockSize: uint32(t.block_size),
				LoraID: int64(t.lora_id), LoraName: cstr(t.lora_name)}
			for j := 0; j < int(t.n_hashes); j++ {
				ct.BlockHashes = append(ct.BlockHashes, tagHash(t.hashes, j, hl, unsigned))
			}
			if t.parent_hash != nil {
				p := tagHash(t.parent_hash, 0, hl, unsigned)
				ct.Parent = &p
			}
			if t.n_tokens > 0 {
				ct.TokenIDs = append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(t.token_ids)), int(t.n_tokens))...)
			}
			out[i] = ct
		}
		attached, err := h.Tag(out)
		return C.int(attached), err
	})
}
