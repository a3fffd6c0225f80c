// The public dfkv_* C ABI: each function forwards to its Go export. Compiling this file
// against dfkv.h makes the compiler check the header's prototypes against the real entry
// points. Handles are opaque integers from the Go handle table, never Go pointers.
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dfkv.h"
#include "fastget.h"
#include "_cgo_export.h"

#define H(c) ((uintptr_t)(c))

/* dfkv_last_error: per handle and per calling thread (errno-like), so concurrent callers
 * never see, or tear, each other's messages. The Go exports run on the caller's thread and
 * store the reason of each failure here: a few slots per thread, one per handle recently
 * failed on, the oldest reused. The slots live in a heap block per thread (pthread key, freed
 * at thread exit), not in _Thread_local storage: a dlopen'ed Go library gets only the small
 * static TLS surplus. */
enum { ERR_SLOTS = 8, ERR_LEN = 384 };
struct errs {
  uintptr_t handle[ERR_SLOTS];
  unsigned char used[ERR_SLOTS];
  unsigned next;
  int status[ERR_SLOTS]; /* DFKV_STATUS_* of the same failure (dfkv_last_status) */
  char msg[ERR_SLOTS][ERR_LEN];
};
static pthread_once_t errs_once = PTHREAD_ONCE_INIT;
static pthread_key_t errs_key;
static int errs_key_ok; /* pthread_key_create succeeded (keys can run out) */
static void errs_make_key(void) { errs_key_ok = pthread_key_create(&errs_key, free) == 0; }

static struct errs* errs_get(int create) {
  pthread_once(&errs_once, errs_make_key);
  if (!errs_key_ok) return NULL; /* no key: reasons are lost, calls still fail cleanly */
  struct errs* e = pthread_getspecific(errs_key);
  if (e == NULL && create) {
    e = calloc(1, sizeof *e);
    if (e != NULL && pthread_setspecific(errs_key, e) != 0) {
      free(e);
      e = NULL;
    }
  }
  return e;
}

static int err_slot(const struct errs* e, uintptr_t c) {
  for (int i = 0; e != NULL && i < ERR_SLOTS; i++)
    if (e->used[i] && e->handle[i] == c) return i;
  return -1;
}

void dfkvc_set_error(uintptr_t c, const char* msg, size_t n, int status) {
  struct errs* e = errs_get(1);
  if (e == NULL) return; /* out of memory: the reason is lost, the call still fails */
  int i = err_slot(e, c);
  if (i < 0) {
    i = (int)(e->next++ % ERR_SLOTS);
    e->used[i] = 1;
    e->handle[i] = c;
  }
  if (n >= ERR_LEN) n = ERR_LEN - 1;
  memcpy(e->msg[i], msg, n);
  e->msg[i][n] = '\0';
  e->status[i] = status;
}

const char* dfkv_last_error(dfkv_client_t c) {
  struct errs* e = errs_get(0);
  int i = err_slot(e, H(c));
  return i < 0 ? "" : e->msg[i];
}

int dfkv_last_status(dfkv_client_t c) {
  struct errs* e = errs_get(0);
  int i = err_slot(e, H(c));
  return i < 0 ? DFKV_STATUS_OK : e->status[i];
}

/* Caller threads and the Go scheduler (docs/BENCHMARKS.md, "C ABI, part 4"). A C thread that
 * has called into Go keeps a Go P, in the system-call state, while it runs its own code
 * between calls, and its calls never schedule a goroutine on that P. Once 10 ms pass, sysmon
 * takes such a P back, and again at every later check: it then polls every 20 us and hands
 * Ps around for as long as the thread keeps calling. A busy caller thread (calls less than
 * BUSY_GAP apart) therefore yields once every YIELD_EVERY, well inside the 10 ms, which
 * schedules its goroutine anew on its P; with a P idle as well, sysmon then leaves the
 * caller's P alone. It yields only while there are fewer caller threads than Ps: without an
 * idle P sysmon takes the P back anyway, and a yield's two thread wake-ups would only add
 * latency. The library does not raise GOMAXPROCS to make room (measured: more CPU per GB and
 * lower x4 throughput with more caller threads than CPUs). A thread is counted from its
 * first data call until it exits. */
enum { YIELD_EVERY_NS = 6000000, BUSY_GAP_NS = 4000000 };
struct caller {
  long long last_call, last_yield;
};
static pthread_once_t caller_once = PTHREAD_ONCE_INIT;
static pthread_key_t caller_key;
static int caller_key_ok; /* pthread_key_create succeeded (keys can run out) */
static atomic_int caller_threads;
static atomic_int go_procs = 1; /* GOMAXPROCS as of the latest thread's first call */
static void caller_exit(void* p) {
  atomic_fetch_sub(&caller_threads, 1);
  free(p);
}
static void caller_make_key(void) { caller_key_ok = pthread_key_create(&caller_key, caller_exit) == 0; }
int dfkvc_caller_threads(void) { return atomic_load(&caller_threads); }

static void caller_tick(void) {
  pthread_once(&caller_once, caller_make_key);
  if (!caller_key_ok) return; /* no key: callers go untracked and never yield */
  struct caller* c = pthread_getspecific(caller_key);
  long long now = dfkvc_mono_ns();
  if (c == NULL) {
    c = calloc(1, sizeof *c);
    if (c == NULL) return; /* out of memory: this thread is simply not tracked */
    if (pthread_setspecific(caller_key, c) != 0) {
      free(c);
      return;
    }
    c->last_call = c->last_yield = now;
    atomic_fetch_add(&caller_threads, 1);
    atomic_store(&go_procs, dfkvgo_gomaxprocs());
    return;
  }
  long long gap = now - c->last_call;
  c->last_call = now;
  if (gap < BUSY_GAP_NS && now - c->last_yield >= YIELD_EVERY_NS &&
      atomic_load(&caller_threads) < atomic_load(&go_procs)) {
    c->last_yield = now;
    dfkvgo_yield();
  }
}

dfkv_client_t dfkv_open_v2(const dfkv_client_options_v2* o) {
  return (dfkv_client_t)dfkvgo_open_v2((dfkv_client_options_v2*)o);
}
void dfkv_close(dfkv_client_t c) { dfkvgo_close(H(c)); }

int dfkv_put(dfkv_client_t c, const void* key, uint64_t key_len, const void* value, uint64_t n) {
  caller_tick();
  return dfkvgo_put(H(c), (void*)key, key_len, (void*)value, n);
}
int dfkv_get(dfkv_client_t c, const void* key, uint64_t key_len, void* buf, uint64_t n) {
  int rc = dfkvc_fast_get(H(c), key, key_len, buf, n, DFKVC_FLAG_EXACT, NULL);
  if (rc != DFKVC_FAST_FALLBACK) return rc;
  caller_tick();
  return dfkvgo_get(H(c), (void*)key, key_len, buf, n);
}
int dfkv_get_auto(dfkv_client_t c, const void* key, uint64_t key_len, void* buf, uint64_t cap,
                  uint64_t* out_len) {
  int rc = dfkvc_fast_get(H(c), key, key_len, buf, cap, DFKVC_FLAG_CAP, out_len);
  if (rc != DFKVC_FAST_FALLBACK) return rc;
  caller_tick();
  return dfkvgo_get_auto(H(c), (void*)key, key_len, buf, cap, out_len);
}
int dfkv_exist(dfkv_client_t c, const void* key, uint64_t key_len) {
  caller_tick();
  return dfkvgo_exist(H(c), (void*)key, key_len);
}
int dfkv_remove(dfkv_client_t c, const void* key, uint64_t key_len) {
  caller_tick();
  return dfkvgo_remove(H(c), (void*)key, key_len);
}

int dfkv_batch_put(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                   const void* const* values, const uint64_t* value_lens, int n, int* out_ok) {
  caller_tick();
  return dfkvgo_batch_put(H(c), (void**)keys, (uint64_t*)key_lens, (void**)values,
                          (uint64_t*)value_lens, n, out_ok);
}
int dfkv_batch_get(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                   void* const* bufs, const uint64_t* lens, int n, int* out_ok) {
  caller_tick();
  return dfkvgo_batch_get(H(c), (void**)keys, (uint64_t*)key_lens, (void**)bufs, (uint64_t*)lens,
                          n, out_ok);
}
int dfkv_batch_get_auto(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                        void* const* bufs, const uint64_t* caps, int n, int* out_ok,
                        uint64_t* out_lens) {
  caller_tick();
  return dfkvgo_batch_get_auto(H(c), (void**)keys, (uint64_t*)key_lens, (void**)bufs,
                               (uint64_t*)caps, n, out_ok, out_lens);
}
int dfkv_batch_exist(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens, int n,
                     int* out_ok) {
  caller_tick();
  return dfkvgo_batch_exist(H(c), (void**)keys, (uint64_t*)key_lens, n, out_ok);
}
int dfkv_batch_remove(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens, int n,
                      int* out_ok) {
  caller_tick();
  return dfkvgo_batch_remove(H(c), (void**)keys, (uint64_t*)key_lens, n, out_ok);
}

int dfkv_batch_put_sg(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                      const void* const* const* seg_ptrs, const uint64_t* const* seg_lens,
                      const uint32_t* seg_counts, int n, int* out_ok) {
  caller_tick();
  return dfkvgo_batch_put_sg(H(c), (void**)keys, (uint64_t*)key_lens, (void***)seg_ptrs,
                             (uint64_t**)seg_lens, (uint32_t*)seg_counts, n, out_ok);
}
int dfkv_batch_get_auto_sg(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                           void* const* const* seg_ptrs, const uint64_t* const* seg_lens,
                           const uint32_t* seg_counts, int n, int* out_ok, uint64_t* out_lens) {
  caller_tick();
  return dfkvgo_batch_get_auto_sg(H(c), (void**)keys, (uint64_t*)key_lens, (void***)seg_ptrs,
                                  (uint64_t**)seg_lens, (uint32_t*)seg_counts, n, out_ok,
                                  out_lens);
}
uint32_t dfkv_max_sg_segs(dfkv_client_t c) { return dfkvgo_max_sg_segs(H(c)); }

int dfkv_register_memory(dfkv_client_t c, void* base, uint64_t size) {
  return dfkvgo_register_memory(H(c), base, size);
}
int dfkv_unregister_memory(dfkv_client_t c, void* base, uint64_t size) {
  return dfkvgo_unregister_memory(H(c), base, size);
}
int dfkv_register_dmabuf(dfkv_client_t c, int fd, uint64_t offset, uint64_t size, uint64_t iova) {
  return dfkvgo_register_dmabuf(H(c), fd, offset, size, iova);
}
int dfkv_unregister_dmabuf(dfkv_client_t c, uint64_t iova, uint64_t size) {
  return dfkvgo_unregister_dmabuf(H(c), iova, size);
}
const char* dfkv_transport_mode(dfkv_client_t c) { return dfkvgo_transport_mode(H(c)); }
uint64_t dfkv_stats_snapshot(dfkv_client_t c, char* buf, uint64_t cap) {
  return dfkvgo_stats_snapshot(H(c), buf, cap);
}
const char* dfkv_version(void) { return dfkvgo_version(); }

int dfkv_batch_exist_lease(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                           int n, uint32_t lease_ms, int* out_ok) {
  caller_tick();
  return dfkvgo_batch_exist_lease(H(c), (void**)keys, (uint64_t*)key_lens, n, lease_ms, out_ok);
}
uint64_t dfkv_max_value_size(dfkv_client_t c) { return dfkvgo_max_value_size(H(c)); }

int dfkv_tag(dfkv_client_t c, const dfkv_block_tag* tags, int n) {
  return dfkvgo_tag(H(c), (dfkv_block_tag*)tags, n);
}
