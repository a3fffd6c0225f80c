// The C ABI's GET fast path (fastget.c): the C side's entry points, used by dfkv_abi.c and,
// through cgo, by fast.go.
#ifndef DFKV_FASTGET_H
#define DFKV_FASTGET_H

#include <stddef.h>
#include <stdint.h>

/* dfkvc_fast_get's answer when the call must go through Go instead. */
#define DFKVC_FAST_FALLBACK (-2)

/* Request flags of a GET (wire.FlagExact, wire.FlagCap). */
#define DFKVC_FLAG_EXACT 1u
#define DFKVC_FLAG_CAP 2u

/* One GET in C: 1 hit (*out_len set when not NULL), 0 miss or failure (the reason kept for
 * dfkv_last_error), DFKVC_FAST_FALLBACK when the Go path must serve it. */
int dfkvc_fast_get(uintptr_t id, const void* key, uint64_t key_len, void* buf, uint64_t n,
                   unsigned flags, uint64_t* out_len);

/* Registration, called by fast.go. probe_req is a 64-byte request header that Go encoded
 * for the fields dfkvc_fast_register documents, probe_resp a 32-byte response header; the
 * fast path stays off unless this file's encoder and decoder agree with them. */
int dfkvc_fast_register(uintptr_t id, uint64_t tenant, const void* ns, size_t ns_len,
                        long long io_timeout_ns, int pool_cap, unsigned max_status,
                        const char* miss_msg, size_t miss_len, const void* probe_req,
                        const void* probe_resp);
void dfkvc_fast_set_view(uintptr_t id, const uint64_t* hashes, const int32_t* nodes,
                         int npoints, const uint32_t* uids, int nmembers);
void dfkvc_fast_cool(uintptr_t id, uint32_t uid, long long until_unix_ns);
size_t dfkvc_fast_take(uintptr_t id, uint64_t* lat_ns, size_t cap, uint64_t* hits,
                       uint64_t* misses, uint64_t* bytes);
void dfkvc_fast_counts(uintptr_t id, uint64_t* gets, uint64_t* fallbacks, uint64_t* dials,
                       uint64_t* conns, uint64_t* members);
void dfkvc_fast_close(uintptr_t id);
/* CLOCK_MONOTONIC in nanoseconds (shared with dfkv_abi.c's caller tracking). */
long long dfkvc_mono_ns(void);
/* Why the fast path is off in this process ("" when it is available): SHA-256 not found. */
const char* dfkvc_fast_unavailable(void);

#endif
