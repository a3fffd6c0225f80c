/*
 * dfkv.h — the dfkv C ABI, version 2.
 *
 * A stable, no-throw C interface to the dfkv client (libdfkv.so). Every function is safe
 * to call from any thread. Keys are (pointer, exact length) pairs and may contain NUL or
 * any other byte; values are opaque raw bytes. Buffers passed in are read or written only
 * during the call and never retained.
 *
 * Return conventions
 *   int dfkv_put / batch calls:   0 = success, -1 = failure
 *   int dfkv_get / get_auto / exist / remove:  1 = hit/done, 0 = miss or failure
 *   per-item output arrays (out_*): every slot starts as failure (0 or -1 as documented)
 *   and is set only when that item's outcome is known.
 */
#ifndef DFKV_H
#define DFKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFKV_ABI_VERSION 2u

/* dfkv_client_options_v2.flags */
#define DFKV_CLIENT_OPT_REGISTER_WITH_MDS (1u << 0)
/* RDMA v2 towards servers that serve it (also DFKV_RDMA=1; DFKV_RDMA_PROVIDER=ibverbs|soft,
 * DFKV_RDMA_DEV=<device>); docs/RDMA.md. Servers without RDMA are used over TCP. */
#define DFKV_CLIENT_OPT_RDMA (1u << 1)

typedef struct dfkv_client* dfkv_client_t;

/*
 * Construction options. Set struct_size = sizeof(dfkv_client_options_v2) and
 * abi_version = DFKV_ABI_VERSION; zero every field you do not use. dfkv_open_v2 copies
 * everything it needs: the struct and its strings may be freed after the call.
 */
typedef struct dfkv_client_options_v2 {
  uint32_t struct_size;
  uint32_t abi_version;          /* = 2 */
  const char* members;           /* "id=host:port[@weight],..." static membership, or NULL */
  const void* key_namespace;     /* binary namespace bytes (may contain NUL) */
  uint64_t key_namespace_len;
  uint64_t batch_concurrency;    /* 0 = auto */
  const char* mds_endpoints;     /* "host:port,..." MDS replicas, or NULL */
  const char* mds_group;         /* NULL = "default" */
  int32_t mds_poll_ms;           /* <= 0 = default (3000) */
  uint32_t flags;                /* DFKV_CLIENT_OPT_* */
  const char* client_id;         /* registration id; NULL = generated */
  const char* client_info;       /* "k=v,..." shown by dfkvctl clients */
  int32_t client_heartbeat_ms;   /* <= 0 = default */
  uint32_t reserved0;            /* must be 0 */
} dfkv_client_options_v2;

/* Returns NULL for NULL options, a short struct_size, abi_version != 2, unknown flags,
 * nonzero reserved0, or neither members nor mds_endpoints. */
dfkv_client_t dfkv_open_v2(const dfkv_client_options_v2* options);
void dfkv_close(dfkv_client_t c);

/* Single-key operations. Zero-length values are rejected. */
int dfkv_put(dfkv_client_t c, const void* key, uint64_t key_len, const void* value, uint64_t n);
/* 1 only when the stored value is exactly n bytes (written to buf). */
int dfkv_get(dfkv_client_t c, const void* key, uint64_t key_len, void* buf, uint64_t n);
/* 1 when the stored value fits in cap bytes; *out_len receives its length. */
int dfkv_get_auto(dfkv_client_t c, const void* key, uint64_t key_len, void* buf, uint64_t cap,
                  uint64_t* out_len);
int dfkv_exist(dfkv_client_t c, const void* key, uint64_t key_len);
/* 1 when the owner confirmed the key is gone: removed now or already absent (as in the
 * original dfkv ABI); 0 when that is unknown (timeout, node unavailable, ...). */
int dfkv_remove(dfkv_client_t c, const void* key, uint64_t key_len);

/* Batch operations: parallel arrays of n items. Return 0 when the call itself ran (see the
 * per-item outputs), -1 when it could not (bad arguments, closed client). Items are fanned
 * out concurrently across nodes. out_ok[i] is 1 on success/hit, 0 otherwise. */
int dfkv_batch_put(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                   const void* const* values, const uint64_t* value_lens, int n, int* out_ok);
int dfkv_batch_get(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                   void* const* bufs, const uint64_t* lens, int n, int* out_ok);
int dfkv_batch_get_auto(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                        void* const* bufs, const uint64_t* caps, int n, int* out_ok,
                        uint64_t* out_lens);
int dfkv_batch_exist(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens, int n,
                     int* out_ok);
int dfkv_batch_remove(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens, int n,
                      int* out_ok);

/* Scatter-gather: item i is one stored value made of seg_counts[i] segments
 * (seg_ptrs[i][j], seg_lens[i][j]) concatenated in order. seg_counts[i] must be
 * 1..dfkv_max_sg_segs(c). get_auto_sg scatters a value of at most sum(seg_lens[i]) bytes
 * across the segments in order and reports its length in out_lens[i]. */
int dfkv_batch_put_sg(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                      const void* const* const* seg_ptrs, const uint64_t* const* seg_lens,
                      const uint32_t* seg_counts, int n, int* out_ok);
int dfkv_batch_get_auto_sg(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                           void* const* const* seg_ptrs, const uint64_t* const* seg_lens,
                           const uint32_t* seg_counts, int n, int* out_ok, uint64_t* out_lens);
uint32_t dfkv_max_sg_segs(dfkv_client_t c);

/* Registers [base, base+size) for RDMA once per device (shared by all of the client's RDMA
 * connections, now and later) so PUT sources and GET destinations inside it move without
 * staging copies: 0, or -1 when registration fails. Idempotent for the same range; the
 * memory must stay valid until dfkv_unregister_memory of that range or dfkv_close. On TCP
 * it only records the range (0). A NULL base or a zero size is refused (-1). */
int dfkv_register_memory(dfkv_client_t c, void* base, uint64_t size);
/* Undoes dfkv_register_memory for exactly the range it registered: new calls stop using the
 * registration at once, in-flight ones are waited for (bounded by the I/O timeout), then it
 * is deregistered on every device. 0, after which the caller may free or reuse the memory;
 * -1 with dfkv_last_error set for a range that is not registered (including a second
 * unregister) or one still in use past the wait (it stays registered). */
int dfkv_unregister_memory(dfkv_client_t c, void* base, uint64_t size);
/* "tcp" (RDMA off), "rdma" (in use), or "tcp(<reason RDMA is not in use>)"; static storage,
 * never NULL ("" for NULL, "closed" for a closed client). */
const char* dfkv_transport_mode(dfkv_client_t c);

/* Prometheus text of the client's metrics. Writes at most cap bytes (no NUL) and returns the
 * full length, so cap = 0 asks for the size. */
uint64_t dfkv_stats_snapshot(dfkv_client_t c, char* buf, uint64_t cap);
/* Library version, static storage. */
const char* dfkv_version(void);

/* Why the calling thread's most recent failing call on c failed (misses included: "dfkv: not
 * found"); c = NULL: dfkv_open_v2's refusals and calls made with a NULL handle. "" when this
 * thread has no failure recorded for c; successful calls leave it as it was. Never NULL; valid
 * until this thread's next failing call. A batch call that ran (0) but had failed items keeps
 * the first failed item's reason. Added in 0.2 (ABI v2 unchanged: a new symbol only). */
const char* dfkv_last_error(dfkv_client_t c);
/* Leased lookup (an addition: ABI v2 unchanged). out_ok[i]: 1 = hit and leased: the value
 * is protected from capacity eviction until it is read or lease_ms passes (0 = the server's
 * default, 10 s; at most 60 s); 2 = hit without a lease (the server's lease budget, a capped
 * share of its capacity, is spent); 0 = miss or failure. Returns 0, or -1 when the
 * arguments are unusable. */
int dfkv_batch_exist_lease(dfkv_client_t c, const void* const* keys, const uint64_t* key_lens,
                           int n, uint32_t lease_ms, int* out_ok);
/* Largest value (bytes) every current member accepts: the smaller of the client's limit and
 * each server's HELLO-advertised max value size. Connects to members not yet reached; 0 when
 * none answers or c is NULL/closed. */
uint64_t dfkv_max_value_size(dfkv_client_t c);

/* dfkv_last_status codes (an addition: ABI v2 unchanged). Values never change; new ones may be
 * added, so treat an unknown code like DFKV_STATUS_INTERNAL. */
#define DFKV_STATUS_OK 0               /* no failure recorded */
#define DFKV_STATUS_NOT_FOUND 1        /* a clean miss */
#define DFKV_STATUS_UNAVAILABLE 2      /* the owner could not be reached (down, refused, none) */
#define DFKV_STATUS_TIMEOUT 3          /* the owner did not answer in time */
#define DFKV_STATUS_FORBIDDEN 4        /* the token does not grant the op on this tenant */
#define DFKV_STATUS_TOO_LARGE 5        /* the value exceeds the max value size */
#define DFKV_STATUS_BUFFER_TOO_SMALL 6 /* the stored value is longer than the buffer / not n bytes */
#define DFKV_STATUS_CACHE_FULL 7       /* the node has no room */
#define DFKV_STATUS_QUOTA_EXCEEDED 8   /* the tenant's quota is spent */
#define DFKV_STATUS_BUSY 9             /* the node could not take the write in time; retry */
#define DFKV_STATUS_IO_ERROR 10        /* the node's disk failed the op */
#define DFKV_STATUS_INVALID 11         /* bad arguments or options, or a request refused as invalid */
#define DFKV_STATUS_PROTOCOL 12        /* an answer that breaks the protocol */
#define DFKV_STATUS_CLOSED 13          /* NULL, closed or unknown handle */
#define DFKV_STATUS_INTERNAL 14        /* anything else */
#define DFKV_STATUS_DIRECT_UNSUPPORTED 15 /* a GET into registered device memory (DMA-BUF) that
                                           * cannot be served by RDMA into it: no RDMA to the
                                           * owner, a server without device targets, or the NIC
                                           * refused the registration. Never retried over TCP. */
/* The DFKV_STATUS_* of the failure dfkv_last_error(c) describes (same thread, same handle,
 * same lifetime): what a caller branches on. DFKV_STATUS_OK when none is recorded. */
int dfkv_last_status(dfkv_client_t c);

/* KV events (docs/EVENTS.md; an addition: ABI v2 unchanged). The engine identity of one
 * stored value: a node with --kv-events publishes BlockStored for it, and BlockRemoved when
 * the value is evicted, removed or overwritten. Set struct_size = sizeof(dfkv_block_tag)
 * and zero what you do not use. */
#define DFKV_TAG_HASH_BYTES (1u << 0) /* hashes are hash_len bytes each, else int64_t each */
#define DFKV_TAG_HASH_UINT64 (1u << 1) /* int hashes are uint64_t (vLLM's int block hashes) */
typedef struct dfkv_block_tag {
  uint32_t struct_size;
  uint32_t flags;                /* DFKV_TAG_HASH_BYTES or DFKV_TAG_HASH_UINT64 */
  const void* key;               /* the value's key, as given to dfkv_put */
  uint64_t key_len;
  const char* model;             /* NUL-terminated model/namespace label, or NULL */
  const void* hashes;            /* n_hashes engine block hashes (int64_t or hash_len bytes) */
  uint32_t n_hashes;             /* 1..1024 */
  uint32_t hash_len;             /* with DFKV_TAG_HASH_BYTES: 1..64 bytes per hash */
  const void* parent_hash;       /* one hash of the same kind, or NULL (first block) */
  const int32_t* token_ids;      /* n_tokens token ids, or NULL */
  uint64_t n_tokens;
  uint32_t block_size;           /* tokens per engine block */
  uint32_t reserved0;            /* must be 0 */
  int64_t lora_id;               /* 0 = none */
  const char* lora_name;         /* NULL = none */
} dfkv_block_tag;
/* Attaches tags[0..n) to stored values (send after their PUTs returned), each on the node
 * that owns its key. Returns how many were attached (values not stored are skipped; a node
 * without --kv-events attaches none), or -1 (bad arguments, closed client, a node that
 * failed or is older than tags: see dfkv_last_error). */
int dfkv_tag(dfkv_client_t c, const dfkv_block_tag* tags, int n);

/* GPU-direct loads (docs/CONNECTORS.md "Direct GPU loads"; an addition: ABI v2 unchanged).
 * Registers bytes [offset, offset+size) of the DMA-BUF fd as device memory on every RDMA
 * device the client uses (now and on devices opened later). iova is the address the caller
 * names that memory by (for CUDA: the device pointer of its first byte). The fd may be closed
 * after the call; the memory must stay allocated until dfkv_unregister_dmabuf of that range
 * or dfkv_close. 0, or -1 with dfkv_last_error / dfkv_last_status set: DFKV_STATUS_INVALID
 * (bad fd, size 0, iova 0, overflow), DFKV_STATUS_DIRECT_UNSUPPORTED (no RDMA, or the NIC
 * refused the DMA-BUF).
 *
 * After it returns 0, the buf / bufs / seg_ptrs of every GET call (dfkv_get, dfkv_get_auto,
 * the batch forms and dfkv_batch_get_auto_sg) may be device pointers inside
 * [iova, iova+size): such a destination is written only by the owner's RDMA WRITEs straight
 * into the device memory, never by the CPU, never over TCP and never through a host staging
 * buffer. When that is not possible (no RDMA to the owner, a server without the device-target
 * capability, a registration the NIC refused) the GET (or batch item) fails with
 * DFKV_STATUS_DIRECT_UNSUPPORTED; there is no fallback. A client that has called
 * dfkv_register_dmabuf serves every GET through the library's general path (the C GET fast
 * path, which reads into buffers with the CPU, is turned off for it). PUT sources must stay
 * host memory. */
int dfkv_register_dmabuf(dfkv_client_t c, int fd, uint64_t offset, uint64_t size, uint64_t iova);
/* Undoes dfkv_register_dmabuf for exactly [iova, iova+size): new GETs into it fail at once,
 * queued and in-flight ones are waited for (at most twice the I/O timeout, else -1 with
 * DFKV_STATUS_BUSY and it stays registered), then it is deregistered on every device. 0,
 * after which no remote write can reach the memory and it may be freed; -1 with
 * DFKV_STATUS_INVALID for a range that is not registered (a second unregister included). */
int dfkv_unregister_dmabuf(dfkv_client_t c, uint64_t iova, uint64_t size);

#ifdef __cplusplus
}
#endif

#endif /* DFKV_H */
