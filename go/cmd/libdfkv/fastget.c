// The GET fast path: dfkv_get and dfkv_get_auto served wholly in C, on the caller's thread,
// with no call into Go. Each entry into Go from a foreign thread costs the caller more CPU
// than the rest of the request (the cgo callback and the Go scheduler's handling of a P
// held by a C thread; docs/BENCHMARKS.md, "C ABI, part 4" and "part 5"), so the steady state
// of the engine's hottest call avoids it.
//
// Only the request itself lives here: hash the key (SHA-256 from the system's libcrypto,
// loaded at run time: the path is off without it), find the owner on the ring, send the
// 64-byte header and read the reply into the caller's buffer on a blocking socket with the
// per-request deadline. Everything else stays in Go (fast.go, go/client/detached.go): the sockets are dialed and
// greeted there and handed over; the routing snapshot is published from there when the
// membership changes; the peer cool-down is decided there (a timeout here is reported to
// it); the GETs served here are counted in the client's metrics from there. Anything this
// file does not handle (another status, a size contract broken, a broken stream, a peer
// cooling down, no socket) answers DFKVC_FAST_FALLBACK and the call goes through the Go
// client, which is the full implementation; every dfkv op is idempotent, so a request
// repeated there is safe.
//
// The header layout mirrors schema/wire.fbs (RequestHeader, ResponseHeader); registration
// checks it against headers the generated Go code encoded, and keeps the path off if they
// disagree.
#include "dfkv.h"
#include "fastget.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_cgo_export.h"

void dfkvc_set_error(uintptr_t c, const char* msg, size_t n, int status);

enum {
  REQ_SIZE = 64,
  RESP_SIZE = 32,
  WIRE_MAGIC = 0x314B4644, /* "DFK1" */
  WIRE_VERSION = 1,
  OP_GET = 4,
  ST_OK = 0,
  ST_NOT_FOUND = 1,
  KEYBUF = 4096,    /* the framed namespace kept per client; longer ones keep the path off */
  MAX_KEY = 1 << 24, /* libdfkv's bound (main.go maxKey): a longer key is Go's to refuse */
  LAT_CAP = 16384,  /* latencies kept between two takes by fast.go */
  FAST_EOF = -100000,
  FAST_PROTO = -100001,
};

/* ---- SHA-256 from libcrypto ---- */

/* The low-level calls, not the one-shot SHA256(): in OpenSSL 3 that one fetches the
 * algorithm from the provider on every call (locks, allocations: 3.5 % of a 1 MiB GET's
 * client CPU, measured), while these run the block function directly. SHA256_CTX is 112
 * bytes in OpenSSL 1.1 and 3; the buffer leaves room. */
typedef int (*sha_init_fn)(void*);
typedef int (*sha_update_fn)(void*, const void*, size_t);
typedef int (*sha_final_fn)(unsigned char*, void*);
static sha_init_fn sha_init;
static sha_update_fn sha_update;
static sha_final_fn sha_final;
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

static void sha_load(void) {
  static const char* const names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void* h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) continue;
    sha_init = (sha_init_fn)dlsym(h, "SHA256_Init");
    sha_update = (sha_update_fn)dlsym(h, "SHA256_Update");
    sha_final = (sha_final_fn)dlsym(h, "SHA256_Final");
    if (sha_init && sha_update && sha_final) return; /* kept open for the life of the process */
    sha_init = NULL;
    dlclose(h);
  }
}

const char* dfkvc_fast_unavailable(void) {
  pthread_once(&sha_once, sha_load);
  return sha_init ? "" : "libcrypto (SHA256_Init) not found";
}


/* ---- little-endian fields ---- */

static void put16(unsigned char* p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t be64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

/* object_id is identity.Object: the first 16 bytes of SHA-256(u64le(len ns) || ns ||
 * u64le(len key) || key), pre holding the part before the key's length. */
static void object_id(const unsigned char* pre, size_t pre_len, const void* key, uint64_t key_len,
                      uint64_t* hi, uint64_t* lo) {
  _Alignas(16) unsigned char ctx[256];
  unsigned char kl[8], d[32];
  put64(kl, key_len);
  sha_init(ctx);
  sha_update(ctx, pre, pre_len);
  sha_update(ctx, kl, sizeof kl);
  if (key_len > 0) sha_update(ctx, key, (size_t)key_len);
  sha_final(d, ctx);
  *hi = be64(d);
  *lo = be64(d + 8);
}

/* RequestHeader: magic u32 @0, op u8 @4, flags u8 @5, version u16 @6, count u32 @8,
 * reserved u32 @12, tenant @16, id_hi @24, id_lo @32, offset @40, length @48,
 * payload_len @56. */
static void encode_req(unsigned char* b, unsigned op, unsigned flags, uint64_t tenant,
                       uint64_t hi, uint64_t lo, uint64_t off, uint64_t len, uint64_t payload) {
  put32(b, WIRE_MAGIC);
  b[4] = (unsigned char)op;
  b[5] = (unsigned char)flags;
  put16(b + 6, WIRE_VERSION);
  put32(b + 8, 0);
  put32(b + 12, 0);
  put64(b + 16, tenant);
  put64(b + 24, hi);
  put64(b + 32, lo);
  put64(b + 40, off);
  put64(b + 48, len);
  put64(b + 56, payload);
}

/* ResponseHeader: magic u32 @0, op u8 @4, status u8 @5, version u16 @6, count u32 @8,
 * reserved u32 @12, value_len @16, payload_len @24. */
struct resp {
  unsigned op, status, version;
  uint32_t magic;
  uint64_t value_len, payload_len;
};
static struct resp decode_resp(const unsigned char* b) {
  struct resp r;
  r.magic = get32(b);
  r.op = b[4];
  r.status = b[5];
  r.version = (unsigned)b[6] | (unsigned)b[7] << 8;
  r.value_len = get64(b + 16);
  r.payload_len = get64(b + 24);
  return r;
}

/* ---- clients, nodes, sockets ---- */

struct fconn {
  int fd;
  long long armed; /* SO_RCVTIMEO/SO_SNDTIMEO in force, ns; 0: none yet */
};

struct fnode {
  pthread_mutex_t mu; /* guards idle, nidle, retired */
  struct fconn* idle;
  int nidle;
  int retired;                /* not in the current view: its sockets are closed */
  _Atomic long long cool_till; /* unix ns: fall back to Go (which fails fast) before it */
};

struct fview {
  int npoints, nmembers;
  uint64_t* hash;
  int32_t* node;  /* per point: index in the view's members */
  uint32_t* uid;  /* per member: the node's uid (index in fclient.nodes) */
};

struct fclient {
  uintptr_t id;
  struct fclient* next;
  _Atomic int refs; /* the registry's one, plus one per call in flight */
  _Atomic int closed;

  pthread_rwlock_t lk; /* guards view, nodes, nnodes */
  struct fview* view;
  struct fnode** nodes;
  int nnodes;

  uint64_t tenant;
  unsigned char pre[KEYBUF]; /* u64le(len ns) || ns: what object_id hashes first */
  size_t pre_len;
  long long io_timeout_ns;
  int pool_cap;
  unsigned max_status; /* wire.MaxStatus: a larger one is a reply out of step */
  char miss_msg[128];
  size_t miss_len;

  pthread_mutex_t mmu; /* guards the figures fast.go takes */
  uint64_t hits, misses, bytes, nlat;
  uint64_t lat[LAT_CAP];

  _Atomic uint64_t gets, fallbacks, dials;
  _Atomic int64_t conns;
};

static pthread_rwlock_t reg_lk = PTHREAD_RWLOCK_INITIALIZER;
static struct fclient* reg_head;

/* A child of fork() shares the parent's sockets: reading one from two processes would mix
 * their replies. The child never uses them; its calls go to Go, which refuses or fails as
 * it did before this path existed. */
static atomic_int forked;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void on_fork_child(void) { atomic_store(&forked, 1); }
static void fork_hook(void) { pthread_atfork(NULL, NULL, on_fork_child); }

long long dfkvc_mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
#define mono_now dfkvc_mono_ns
static long long unix_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void conn_close(struct fclient* fc, struct fconn* f) {
  close(f->fd);
  f->fd = -1;
  atomic_fetch_sub(&fc->conns, 1);
}

static void node_drain(struct fclient* fc, struct fnode* n) {
  pthread_mutex_lock(&n->mu);
  for (int i = 0; i < n->nidle; i++) conn_close(fc, &n->idle[i]);
  n->nidle = 0;
  pthread_mutex_unlock(&n->mu);
}

static void view_free(struct fview* v) {
  if (v == NULL) return;
  free(v->hash);
  free(v->node);
  free(v->uid);
  free(v);
}

static void client_free(struct fclient* fc) {
  for (int i = 0; i < fc->nnodes; i++) {
    node_drain(fc, fc->nodes[i]);
    pthread_mutex_destroy(&fc->nodes[i]->mu);
    free(fc->nodes[i]->idle);
    free(fc->nodes[i]);
  }
  free(fc->nodes);
  view_free(fc->view);
  pthread_rwlock_destroy(&fc->lk);
  pthread_mutex_destroy(&fc->mmu);
  free(fc);
}

static struct fclient* acquire(uintptr_t id) {
  pthread_rwlock_rdlock(&reg_lk);
  struct fclient* fc = reg_head;
  while (fc != NULL && fc->id != id) fc = fc->next;
  if (fc != NULL) atomic_fetch_add(&fc->refs, 1);
  pthread_rwlock_unlock(&reg_lk);
  return fc;
}

static void release(struct fclient* fc) {
  if (atomic_fetch_sub(&fc->refs, 1) == 1) client_free(fc);
}

/* ---- registration (fast.go) ---- */

int dfkvc_fast_register(uintptr_t id, uint64_t tenant, const void* ns, size_t ns_len,
                        long long io_timeout_ns, int pool_cap, unsigned max_status,
                        const char* miss_msg, size_t miss_len, const void* probe_req,
                        const void* probe_resp) {
  if (dfkvc_fast_unavailable()[0] != 0) return -1;
  pthread_once(&fork_once, fork_hook);
  if (atomic_load(&forked)) return -6;
  if (ns_len + 8 > KEYBUF || io_timeout_ns <= 0 || pool_cap <= 0) return -2;
  /* The probes: Go encoded a request with these fields, and a response (GET, NotFound,
   * value_len and payload_len below); this file must read and write the same bytes. */
  unsigned char mine[REQ_SIZE];
  encode_req(mine, OP_GET, DFKVC_FLAG_CAP, tenant, 0x0102030405060708ULL, 0x1112131415161718ULL,
             0x2122232425262728ULL, 0x3132333435363738ULL, 0x4142434445464748ULL);
  if (memcmp(mine, probe_req, REQ_SIZE) != 0) return -3;
  struct resp r = decode_resp(probe_resp);
  if (r.magic != WIRE_MAGIC || r.op != OP_GET || r.status != ST_NOT_FOUND ||
      r.version != WIRE_VERSION || r.value_len != 0x5152535455565758ULL ||
      r.payload_len != 0x6162636465666768ULL)
    return -4;

  struct fclient* fc = calloc(1, sizeof *fc);
  if (fc == NULL) return -5;
  fc->id = id;
  atomic_init(&fc->refs, 1);
  pthread_rwlock_init(&fc->lk, NULL);
  pthread_mutex_init(&fc->mmu, NULL);
  fc->tenant = tenant;
  put64(fc->pre, ns_len);
  if (ns_len > 0) memcpy(fc->pre + 8, ns, ns_len);
  fc->pre_len = 8 + ns_len;
  fc->io_timeout_ns = io_timeout_ns;
  fc->pool_cap = pool_cap;
  fc->max_status = max_status;
  fc->miss_len = miss_len < sizeof fc->miss_msg ? miss_len : sizeof fc->miss_msg;
  memcpy(fc->miss_msg, miss_msg, fc->miss_len);
  pthread_rwlock_wrlock(&reg_lk);
  fc->next = reg_head;
  reg_head = fc;
  pthread_rwlock_unlock(&reg_lk);
  return 0;
}

void dfkvc_fast_close(uintptr_t id) {
  pthread_rwlock_wrlock(&reg_lk);
  struct fclient** pp = &reg_head;
  while (*pp != NULL && (*pp)->id != id) pp = &(*pp)->next;
  struct fclient* fc = *pp;
  if (fc != NULL) *pp = fc->next;
  pthread_rwlock_unlock(&reg_lk);
  if (fc == NULL) return;
  atomic_store(&fc->closed, 1);
  pthread_rwlock_rdlock(&fc->lk);
  for (int i = 0; i < fc->nnodes; i++) node_drain(fc, fc->nodes[i]);
  pthread_rwlock_unlock(&fc->lk);
  release(fc); /* calls in flight close their sockets as they finish */
}

void dfkvc_fast_set_view(uintptr_t id, const uint64_t* hashes, const int32_t* nodes,
                         int npoints, const uint32_t* uids, int nmembers) {
  struct fclient* fc = acquire(id);
  if (fc == NULL) return;
  struct fview* v = calloc(1, sizeof *v);
  uint32_t maxuid = 0;
  int ok = v != NULL && npoints >= 0 && nmembers >= 0;
  if (ok) {
    v->npoints = npoints;
    v->nmembers = nmembers;
    v->hash = malloc(sizeof(uint64_t) * (npoints ? npoints : 1));
    v->node = malloc(sizeof(int32_t) * (npoints ? npoints : 1));
    v->uid = malloc(sizeof(uint32_t) * (nmembers ? nmembers : 1));
    ok = v->hash && v->node && v->uid;
  }
  if (ok) {
    memcpy(v->hash, hashes, sizeof(uint64_t) * npoints);
    memcpy(v->node, nodes, sizeof(int32_t) * npoints);
    memcpy(v->uid, uids, sizeof(uint32_t) * nmembers);
    for (int i = 0; i < npoints; i++) ok &= v->node[i] >= 0 && v->node[i] < nmembers;
    for (int i = 0; i < nmembers; i++) maxuid = uids[i] > maxuid ? uids[i] : maxuid;
    ok &= maxuid < (1u << 20);
  }
  pthread_rwlock_wrlock(&fc->lk);
  if (ok && (int)maxuid >= fc->nnodes && nmembers > 0) {
    struct fnode** grown = realloc(fc->nodes, sizeof *grown * (maxuid + 1));
    if (grown == NULL) {
      ok = 0;
    } else {
      fc->nodes = grown;
      for (; fc->nnodes <= (int)maxuid; fc->nnodes++) {
        struct fnode* n = calloc(1, sizeof *n);
        struct fconn* idle = calloc((size_t)fc->pool_cap, sizeof *idle);
        if (n == NULL || idle == NULL) {
          free(n);
          free(idle);
          ok = 0;
          break;
        }
        pthread_mutex_init(&n->mu, NULL);
        n->idle = idle;
        n->retired = 1;
        fc->nodes[fc->nnodes] = n;
      }
    }
  }
  struct fview* old = fc->view;
  if (ok) {
    fc->view = v;
    for (int i = 0; i < fc->nnodes; i++) {
      int in = 0;
      for (int j = 0; j < nmembers && !in; j++) in = uids[j] == (uint32_t)i;
      struct fnode* n = fc->nodes[i];
      pthread_mutex_lock(&n->mu);
      n->retired = !in;
      if (!in) {
        for (int k = 0; k < n->nidle; k++) conn_close(fc, &n->idle[k]);
        n->nidle = 0;
      }
      pthread_mutex_unlock(&n->mu);
    }
  } else {
    fc->view = NULL; /* no routing rather than stale routing: every GET goes through Go */
  }
  pthread_rwlock_unlock(&fc->lk);
  view_free(old);
  if (!ok) view_free(v);
  release(fc);
}

void dfkvc_fast_cool(uintptr_t id, uint32_t uid, long long until_unix_ns) {
  struct fclient* fc = acquire(id);
  if (fc == NULL) return;
  pthread_rwlock_rdlock(&fc->lk);
  if ((int)uid < fc->nnodes) {
    atomic_store(&fc->nodes[uid]->cool_till, until_unix_ns);
    node_drain(fc, fc->nodes[uid]); /* after a failure its sockets are suspect */
  }
  pthread_rwlock_unlock(&fc->lk);
  release(fc);
}

size_t dfkvc_fast_take(uintptr_t id, uint64_t* lat_ns, size_t cap, uint64_t* hits,
                       uint64_t* misses, uint64_t* bytes) {
  *hits = *misses = *bytes = 0;
  struct fclient* fc = acquire(id);
  if (fc == NULL) return 0;
  pthread_mutex_lock(&fc->mmu);
  size_t n = fc->nlat < cap ? fc->nlat : cap;
  memcpy(lat_ns, fc->lat, n * sizeof *lat_ns);
  if (n < fc->nlat) memmove(fc->lat, fc->lat + n, (fc->nlat - n) * sizeof *lat_ns);
  fc->nlat -= n;
  *hits = fc->hits;
  *misses = fc->misses;
  *bytes = fc->bytes;
  fc->hits = fc->misses = fc->bytes = 0;
  pthread_mutex_unlock(&fc->mmu);
  release(fc);
  return n;
}

void dfkvc_fast_counts(uintptr_t id, uint64_t* gets, uint64_t* fallbacks, uint64_t* dials,
                       uint64_t* conns, uint64_t* members) {
  *gets = *fallbacks = *dials = *conns = *members = 0;
  struct fclient* fc = acquire(id);
  if (fc == NULL) return;
  pthread_rwlock_rdlock(&fc->lk);
  *members = fc->view ? (uint64_t)fc->view->nmembers : 0;
  pthread_rwlock_unlock(&fc->lk);
  *gets = atomic_load(&fc->gets);
  *fallbacks = atomic_load(&fc->fallbacks);
  *dials = atomic_load(&fc->dials);
  int64_t c = atomic_load(&fc->conns);
  *conns = c > 0 ? (uint64_t)c : 0;
  release(fc);
}

/* ---- one GET ---- */

/* arm makes sure the next system call cannot block much past the deadline (as fdConn.arm in
 * go/client/fdio_linux.go: the steady state makes no setsockopt at all). */
static int arm(struct fconn* f, long long deadline) {
  long long rem = deadline - mono_now();
  if (rem <= 0) return -ETIMEDOUT;
  if (f->armed != 0 && f->armed <= rem + rem / 8 && f->armed >= rem / 2) return 0;
  long long t = rem < 1000 ? 1000 : rem;
  struct timeval tv = {.tv_sec = t / 1000000000LL, .tv_usec = (t % 1000000000LL) / 1000};
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  if (setsockopt(f->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(f->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    return -errno;
  f->armed = rem;
  return 0;
}

/* retry_or_fail classifies a failed socket call (errno set): 0 to repeat it (EINTR, or a
 * socket timeout that fired before the deadline: re-armed with what remains), else
 * -ETIMEDOUT or -errno (fdConn.retry in go/client/fdio_linux.go). */
static int retry_or_fail(struct fconn* f, long long deadline) {
  if (errno == EINTR) return 0;
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    if (mono_now() >= deadline) return -ETIMEDOUT;
    f->armed = 0;
    return 0;
  }
  return -errno;
}

/* io_full sends or receives exactly n bytes: 0, -ETIMEDOUT past the deadline, FAST_EOF when
 * the peer closed, or -errno. */
static int io_full(struct fconn* f, int sending, unsigned char* p, size_t n, long long deadline) {
  while (n > 0) {
    int a = arm(f, deadline);
    if (a != 0) return a;
    ssize_t r = sending ? send(f->fd, p, n, MSG_NOSIGNAL) : recv(f->fd, p, n, MSG_WAITALL);
    if (r < 0) {
      int e = retry_or_fail(f, deadline);
      if (e == 0) continue;
      return e;
    }
    if (r == 0) return FAST_EOF;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* recv_head receives the 32-byte reply header into hdr and, in the same calls, what has
 * arrived of the payload into buf (*got bytes); same returns as io_full. */
static int recv_head(struct fconn* f, unsigned char* hdr, void* buf, uint64_t n, size_t* got,
                     long long deadline) {
  size_t have = 0;
  while (have < RESP_SIZE) {
    int a = arm(f, deadline);
    if (a != 0) return a;
    struct iovec iov[2] = {{.iov_base = hdr + have, .iov_len = RESP_SIZE - have},
                           {.iov_base = buf, .iov_len = (size_t)n}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t r = recvmsg(f->fd, &m, 0);
    if (r < 0) {
      int e = retry_or_fail(f, deadline);
      if (e == 0) continue;
      return e;
    }
    if (r == 0) return FAST_EOF;
    have += (size_t)r;
  }
  *got = have - RESP_SIZE;
  return 0;
}

static void record(struct fclient* fc, int hit, uint64_t n, long long t0) {
  long long d = mono_now() - t0;
  pthread_mutex_lock(&fc->mmu);
  if (hit) {
    fc->hits++;
    fc->bytes += n;
  } else {
    fc->misses++;
  }
  if (fc->nlat < LAT_CAP) fc->lat[fc->nlat++] = d > 0 ? (uint64_t)d : 0;
  pthread_mutex_unlock(&fc->mmu);
}

/* put_back returns a healthy socket to its node's pool, or closes it. */
static void put_back(struct fclient* fc, struct fnode* node, struct fconn* f) {
  pthread_mutex_lock(&node->mu);
  int keep = !node->retired && !atomic_load(&fc->closed) && node->nidle < fc->pool_cap;
  if (keep) node->idle[node->nidle++] = *f;
  pthread_mutex_unlock(&node->mu);
  if (!keep) conn_close(fc, f);
}

int dfkvc_fast_get(uintptr_t id, const void* key, uint64_t key_len, void* buf, uint64_t n,
                   unsigned flags, uint64_t* out_len) {
  if ((key == NULL && key_len > 0) || key_len > MAX_KEY || buf == NULL || n == 0 || n > (1ULL << 40) ||
      atomic_load_explicit(&forked, memory_order_relaxed))
    return DFKVC_FAST_FALLBACK; /* Go says why */
  if (out_len != NULL) *out_len = 0;
  struct fclient* fc = acquire(id); /* registered: libcrypto's SHA256 is loaded */
  if (fc == NULL) return DFKVC_FAST_FALLBACK;
  int rc = DFKVC_FAST_FALLBACK;
  long long t0 = mono_now();

  uint64_t hi, lo;
  object_id(fc->pre, fc->pre_len, key, key_len, &hi, &lo);

  /* The owner: the first point whose hash is >= hi, else the first (ring.Ring.Owner). */
  pthread_rwlock_rdlock(&fc->lk);
  struct fview* v = fc->view;
  struct fnode* node = NULL;
  uint32_t uid = 0;
  if (v != NULL && v->npoints > 0) {
    int lo_i = 0, hi_i = v->npoints;
    while (lo_i < hi_i) {
      int mid = lo_i + (hi_i - lo_i) / 2;
      if (v->hash[mid] < hi)
        lo_i = mid + 1;
      else
        hi_i = mid;
    }
    if (lo_i == v->npoints) lo_i = 0;
    uid = v->uid[v->node[lo_i]];
    node = fc->nodes[uid];
  }
  pthread_rwlock_unlock(&fc->lk);
  if (node == NULL) goto out;
  long long cool = atomic_load(&node->cool_till);
  if (cool != 0 && cool > unix_now()) goto out;

  struct fconn f = {.fd = -1};
  pthread_mutex_lock(&node->mu);
  if (node->nidle > 0) f = node->idle[--node->nidle];
  pthread_mutex_unlock(&node->mu);
  if (f.fd < 0) {
    f.fd = dfkvgo_fast_dial(id, uid); /* rare: a new socket from Go */
    if (f.fd < 0) goto out;
    atomic_fetch_add(&fc->dials, 1);
    atomic_fetch_add(&fc->conns, 1);
  }

  long long deadline = t0 + fc->io_timeout_ns;
  unsigned char hdr[REQ_SIZE > RESP_SIZE ? REQ_SIZE : RESP_SIZE];
  encode_req(hdr, OP_GET, flags, fc->tenant, hi, lo, 0, n, 0);
  int e = io_full(&f, 1, hdr, REQ_SIZE, deadline);
  /* The reply's header and whatever of the value has arrived, in one call: a small value
   * needs no second one. Only this reply can arrive (one request in flight per socket),
   * and its payload is at most n bytes, so nothing past it is ever read. */
  size_t got = 0;
  if (e == 0) e = recv_head(&f, hdr, buf, n, &got, deadline);
  struct resp r = {0};
  if (e == 0) {
    r = decode_resp(hdr);
    if (r.magic != WIRE_MAGIC || r.version != WIRE_VERSION || r.op != OP_GET)
      e = FAST_PROTO;
    else if (r.status == ST_OK && (r.payload_len > n || r.payload_len == 0 ||
                                   ((flags & DFKVC_FLAG_EXACT) && r.payload_len != n)))
      e = FAST_PROTO;
    else if (r.status > fc->max_status || (r.status != ST_OK && r.payload_len != 0))
      e = FAST_PROTO;
    else if (got > r.payload_len)
      e = FAST_PROTO;
  }
  if (e == 0 && r.status == ST_OK && got < r.payload_len)
    e = io_full(&f, 0, (unsigned char*)buf + got, r.payload_len - got, deadline);
  if (e != 0) {
    conn_close(fc, &f);
    if (e == -ETIMEDOUT) {
      /* Go starts the peer's cool-down and keeps the reason; repeating the request there
       * would only double the caller's wait. */
      dfkvgo_fast_failed(id, uid, (long long)(mono_now() - t0));
      atomic_fetch_add(&fc->gets, 1);
      rc = 0;
    }
    /* Otherwise (a stale or broken stream, a reply out of step) the Go client repeats the
     * request on its own connection, with its retry, cool-down and error reporting. */
    goto out;
  }
  if (r.status == ST_OK) {
    put_back(fc, node, &f);
    if (out_len != NULL) *out_len = r.payload_len;
    record(fc, 1, r.payload_len, t0);
    atomic_fetch_add(&fc->gets, 1);
    rc = 1;
  } else if (r.status == ST_NOT_FOUND) {
    put_back(fc, node, &f);
    record(fc, 0, 0, t0);
    atomic_fetch_add(&fc->gets, 1);
    dfkvc_set_error(id, fc->miss_msg, fc->miss_len, DFKV_STATUS_NOT_FOUND);
    rc = 0;
  } else {
    put_back(fc, node, &f); /* a status reply leaves the stream in step */
  }
out:
  if (rc == DFKVC_FAST_FALLBACK) atomic_fetch_add(&fc->fallbacks, 1);
  release(fc);
  return rc;
}
