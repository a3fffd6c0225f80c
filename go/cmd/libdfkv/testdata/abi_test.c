/* Exercises every dfkv.h function against a running dfkv_server (address in DFKV_TEST_ADDR),
 * including the error paths. Prints one line per failed check and a final
 * "N passed, M failed" line; exits nonzero on any failure. */
#define _GNU_SOURCE /* memfd_create */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dfkv.h"

static int passed, failed;
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (cond) {                                              \
      passed++;                                              \
    } else {                                                 \
      failed++;                                              \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                          \
      fputc('\n', stderr);                                   \
    }                                                        \
  } while (0)

static dfkv_client_options_v2 base_options(const char* members, const void* ns, size_t ns_len) {
  dfkv_client_options_v2 o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.abi_version = DFKV_ABI_VERSION;
  o.members = members;
  o.key_namespace = ns;
  o.key_namespace_len = ns_len;
  return o;
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

struct other_thread {
  dfkv_client_t c;
  char before[64], after[512];
};

/* Runs on a second thread: it starts with no error of its own, then records its own miss. */
static void* other_thread_main(void* arg) {
  struct other_thread* t = arg;
  snprintf(t->before, sizeof t->before, "%s", dfkv_last_error(t->c));
  char buf[4];
  if (dfkv_get(t->c, "no-such-key", 11, buf, sizeof buf) == 0)
    snprintf(t->after, sizeof t->after, "%s", dfkv_last_error(t->c));
  return NULL;
}

/* Value of a metric in the client's stats snapshot, or -1 when absent. */
static double stat_value(dfkv_client_t c, const char* name) {
  uint64_t need = dfkv_stats_snapshot(c, NULL, 0);
  char* text = malloc(need + 1);
  double v = -1;
  if (!text) return v;
  uint64_t got = dfkv_stats_snapshot(c, text, need);
  text[got < need ? got : need] = '\0';
  size_t len = strlen(name);
  for (char* line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, name, len) == 0 && line[len] == ' ') {
      v = strtod(line + len + 1, NULL);
      break;
    }
  }
  free(text);
  return v;
}

/* RDMA (DFKV_CLIENT_OPT_RDMA) against a dfkv_server --rdma at DFKV_TEST_RDMA_ADDR, over the
 * provider DFKV_RDMA_PROVIDER names (the soft NIC in tests): 1 B - 64 MiB byte-exact through
 * scalar, batch and scatter-gather calls, from malloc'd memory (transient MRs) and from a
 * registered pool (pool MRs). DFKV_RDMA_MAX_BLOCK decides what goes over RDMA. */
/* DMA-BUF registration (GPU-direct loads). The stand-in for a device allocation is a memfd
 * this program maps itself (the soft RDMA provider maps the fd separately): over RDMA a GET
 * into the range lands in the mapping, written by the NIC; without RDMA registration or the
 * GET fails with DFKV_STATUS_DIRECT_UNSUPPORTED and the mapping stays untouched. */
static void dmabuf_checks(dfkv_client_t c, int rdma) {
  enum { DN = 1 << 16 };
  CHECK(dfkv_register_dmabuf(c, -1, 0, DN, 0x10000) == -1 && dfkv_last_status(c) == DFKV_STATUS_INVALID,
        "register_dmabuf of fd -1: status %d", dfkv_last_status(c));
  CHECK(dfkv_register_dmabuf(c, 0, 0, 0, 0x10000) == -1 && dfkv_last_status(c) == DFKV_STATUS_INVALID,
        "register_dmabuf of 0 bytes: status %d", dfkv_last_status(c));
  CHECK(dfkv_unregister_dmabuf(c, 0x10000, DN) == -1 && dfkv_last_status(c) == DFKV_STATUS_INVALID,
        "unregister_dmabuf of an unknown range: status %d", dfkv_last_status(c));
  int fd = memfd_create("dfkv-abi-dmabuf", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, DN) == 0, "memfd");
  if (fd < 0) return;
  unsigned char* dev = mmap(NULL, DN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(dev != MAP_FAILED, "mmap memfd");
  if (dev == MAP_FAILED) {
    close(fd);
    return;
  }
  const char dk[] = "dmabuf-key";
  unsigned char val[3000];
  fill(val, sizeof val, 77);
  CHECK(dfkv_put(c, dk, sizeof dk - 1, val, sizeof val) == 0, "dmabuf value put: %s", dfkv_last_error(c));
  uint64_t iova = (uint64_t)(uintptr_t)dev;
  int rc = dfkv_register_dmabuf(c, fd, 0, DN, iova);
  close(fd); /* the registration holds its own reference */
  if (!rdma) {
    if (rc == 0) { /* recorded: every GET into it must refuse, the CPU never writing it */
      uint64_t n = 0;
      CHECK(dfkv_get(c, dk, sizeof dk - 1, dev + 4096, sizeof val) == 0 &&
                dfkv_last_status(c) == DFKV_STATUS_DIRECT_UNSUPPORTED,
            "tcp get into device memory: status %d", dfkv_last_status(c));
      CHECK(dfkv_get_auto(c, dk, sizeof dk - 1, dev, DN, &n) == 0 && dfkv_last_status(c) == DFKV_STATUS_DIRECT_UNSUPPORTED,
            "tcp get_auto into device memory: status %d", dfkv_last_status(c));
      int untouched = 1;
      for (size_t i = 0; i < DN; i++) untouched &= dev[i] == 0;
      CHECK(untouched, "a refused device GET wrote the memory");
      CHECK(dfkv_unregister_dmabuf(c, iova, DN) == 0, "unregister_dmabuf on tcp: %s", dfkv_last_error(c));
    } else {
      CHECK(dfkv_last_status(c) == DFKV_STATUS_DIRECT_UNSUPPORTED, "register_dmabuf on tcp: status %d (%s)",
            dfkv_last_status(c), dfkv_last_error(c));
    }
    /* the client still serves host GETs (through the general path from now on) */
    unsigned char host[sizeof val];
    CHECK(dfkv_get(c, dk, sizeof dk - 1, host, sizeof host) == 1 && memcmp(host, val, sizeof val) == 0,
          "host get after register_dmabuf: %s", dfkv_last_error(c));
  } else if (rc != 0 && getenv("DFKV_TEST_DMABUF_MAY_REFUSE")) {
    /* a hardware provider whose NIC refuses DMA-BUF MRs (rxe: EOPNOTSUPP): a clean refusal
       naming why, and the client goes on serving host GETs */
    const char* why = dfkv_last_error(c);
    CHECK(dfkv_last_status(c) == DFKV_STATUS_DIRECT_UNSUPPORTED && why && strstr(why, "not supported"),
          "register_dmabuf over rdma refused: status %d (%s)", dfkv_last_status(c), why);
    printf("note: this NIC refuses DMA-BUF registration: %s\n", why);
    unsigned char host[sizeof val];
    CHECK(dfkv_get(c, dk, sizeof dk - 1, host, sizeof host) == 1 && memcmp(host, val, sizeof val) == 0,
          "host get after a refused register_dmabuf: %s", dfkv_last_error(c));
  } else {
    CHECK(rc == 0, "register_dmabuf over rdma: %s", dfkv_last_error(c));
    double staged = stat_value(c, "dfkv_rdma_staged_ops_total");
    uint64_t n = 0;
    CHECK(dfkv_get(c, dk, sizeof dk - 1, dev + 4096, sizeof val) == 1 && memcmp(dev + 4096, val, sizeof val) == 0,
          "rdma get into device memory: %s", dfkv_last_error(c));
    memset(dev, 0, DN);
    void* sp[2] = {dev + 100, dev + 20000};
    uint64_t sl[2] = {1000, 5000};
    void* const* spp[1] = {sp};
    const uint64_t* slp[1] = {sl};
    const void* ks[1] = {dk};
    uint64_t kl[1] = {sizeof dk - 1};
    uint32_t cnt[1] = {2};
    int ok[1] = {0};
    CHECK(dfkv_batch_get_auto_sg(c, ks, kl, spp, slp, cnt, 1, ok, &n) == 0 && ok[0] == 1 && n == sizeof val &&
              memcmp(dev + 100, val, 1000) == 0 && memcmp(dev + 20000, val + 1000, sizeof val - 1000) == 0,
          "rdma sg get into device memory: %s", dfkv_last_error(c));
    CHECK(stat_value(c, "dfkv_rdma_staged_ops_total") == staged, "a device GET was staged");
    CHECK(dfkv_unregister_dmabuf(c, iova, DN) == 0, "unregister_dmabuf: %s", dfkv_last_error(c));
    CHECK(dfkv_unregister_dmabuf(c, iova, DN) == -1 && dfkv_last_status(c) == DFKV_STATUS_INVALID,
          "second unregister_dmabuf: status %d", dfkv_last_status(c));
  }
  munmap(dev, DN);
}

static void rdma_section(const char* addr) {
  char members[256];
  snprintf(members, sizeof members, "n1=%s", addr);
  dfkv_client_options_v2 o = base_options(members, "rdma", 4);
  o.flags = DFKV_CLIENT_OPT_RDMA;
  dfkv_client_t c = dfkv_open_v2(&o);
  CHECK(c != NULL, "rdma open failed: %s", dfkv_last_error(NULL));
  if (!c) return;
  enum { NS = 6 };
  const uint64_t sizes[NS] = {1, 4095, 65537, 1u << 20, (4u << 20) + 7, 64u << 20};
  char kbuf[NS][8];
  const void* keys[NS];
  uint64_t klens[NS];
  unsigned char* vals[NS];
  unsigned char* bufs[NS];
  int ok[NS];
  for (int i = 0; i < NS; i++) {
    klens[i] = (uint64_t)snprintf(kbuf[i], sizeof kbuf[i], "r%d", i);
    keys[i] = kbuf[i];
    vals[i] = malloc(sizes[i]);
    bufs[i] = malloc(sizes[i]);
    fill(vals[i], sizes[i], 40u + (unsigned)i);
  }
  /* scalar */
  for (int i = 0; i < NS; i++) {
    uint64_t n = sizes[i], len = 0;
    CHECK(dfkv_put(c, keys[i], klens[i], vals[i], n) == 0, "rdma put %llu", (unsigned long long)n);
    memset(bufs[i], 0, n);
    CHECK(dfkv_get(c, keys[i], klens[i], bufs[i], n) == 1 && memcmp(bufs[i], vals[i], n) == 0, "rdma get %llu",
          (unsigned long long)n);
    CHECK(dfkv_get_auto(c, keys[i], klens[i], bufs[i], n, &len) == 1 && len == n, "rdma get_auto %llu",
          (unsigned long long)n);
    if (n > 1) CHECK(dfkv_get(c, keys[i], klens[i], bufs[i], n - 1) == 0, "rdma short exact get %llu", (unsigned long long)n);
    CHECK(dfkv_exist(c, keys[i], klens[i]) == 1, "rdma exist %llu", (unsigned long long)n);
  }
  CHECK(strcmp(dfkv_transport_mode(c), "rdma") == 0, "rdma transport mode %s", dfkv_transport_mode(c));
  /* batch: overwrite with new bytes, read back into cleared buffers */
  for (int i = 0; i < NS; i++) fill(vals[i], sizes[i], 80u + (unsigned)i);
  CHECK(dfkv_batch_put(c, keys, klens, (const void* const*)vals, sizes, NS, ok) == 0, "rdma batch_put");
  for (int i = 0; i < NS; i++) {
    CHECK(ok[i] == 1, "rdma batch_put item %d", i);
    memset(bufs[i], 0, sizes[i]);
  }
  CHECK(dfkv_batch_get(c, keys, klens, (void* const*)bufs, sizes, NS, ok) == 0, "rdma batch_get");
  for (int i = 0; i < NS; i++)
    CHECK(ok[i] == 1 && memcmp(bufs[i], vals[i], sizes[i]) == 0, "rdma batch_get item %d (%llu bytes)", i,
          (unsigned long long)sizes[i]);
  CHECK(dfkv_batch_exist(c, keys, klens, NS, ok) == 0, "rdma batch_exist");
  for (int i = 0; i < NS; i++) CHECK(ok[i] == 1, "rdma batch_exist item %d", i);
  /* scatter-gather: each value read back as two segments of the buffer */
  void* segp[NS][2];
  uint64_t segl[NS][2];
  void* const* segpp[NS];
  const uint64_t* seglp[NS];
  uint32_t counts[NS];
  uint64_t lens[NS];
  for (int i = 0; i < NS; i++) {
    memset(bufs[i], 0, sizes[i]);
    segp[i][0] = bufs[i];
    segl[i][0] = sizes[i] / 2;
    segp[i][1] = bufs[i] + sizes[i] / 2;
    segl[i][1] = sizes[i] - sizes[i] / 2;
    counts[i] = sizes[i] > 1 ? 2 : 1;
    if (counts[i] == 1) segl[i][0] = 1, segp[i][0] = bufs[i];
    segpp[i] = segp[i];
    seglp[i] = segl[i];
  }
  CHECK(dfkv_batch_get_auto_sg(c, keys, klens, segpp, seglp, counts, NS, ok, lens) == 0, "rdma batch_get_auto_sg");
  for (int i = 0; i < NS; i++)
    CHECK(ok[i] == 1 && lens[i] == sizes[i] && memcmp(bufs[i], vals[i], sizes[i]) == 0, "rdma sg get item %d", i);
  /* a registered pool (as an engine connector's KV pool): batches from and into it */
  enum { PN = 4, PB = 1 << 20 };
  unsigned char* pool = malloc((size_t)PN * PB);
  CHECK(dfkv_register_memory(c, pool, (uint64_t)PN * PB) == 0, "register pool");
  CHECK(dfkv_register_memory(c, pool, (uint64_t)PN * PB) == 0, "register pool again (idempotent)");
  double pool_before = stat_value(c, "dfkv_rdma_mr_pool_ops_total");
  double adhoc_before = stat_value(c, "dfkv_rdma_mr_adhoc_registrations_total");
  double staged_before = stat_value(c, "dfkv_rdma_staged_ops_total");
  const void* pk[PN];
  uint64_t pkl[PN], pl[PN];
  void* pv[PN];
  char pkbuf[PN][8];
  for (int i = 0; i < PN; i++) {
    pkl[i] = (uint64_t)snprintf(pkbuf[i], sizeof pkbuf[i], "p%d", i);
    pk[i] = pkbuf[i];
    pv[i] = pool + (size_t)i * PB;
    pl[i] = PB;
    fill(pv[i], PB, 120u + (unsigned)i);
  }
  CHECK(dfkv_batch_put(c, pk, pkl, (const void* const*)pv, pl, PN, ok) == 0, "pool batch_put");
  memset(pool, 0, (size_t)PN * PB);
  CHECK(dfkv_batch_get(c, pk, pkl, (void* const*)pv, pl, PN, ok) == 0, "pool batch_get");
  unsigned char* want = malloc(PB);
  for (int i = 0; i < PN; i++) {
    fill(want, PB, 120u + (unsigned)i);
    CHECK(ok[i] == 1 && memcmp(pv[i], want, PB) == 0, "pool batch item %d", i);
  }
  free(want);
  CHECK(stat_value(c, "dfkv_rdma_mr_pool_ops_total") - pool_before == 2 * PN, "pool MR ops %g -> %g", pool_before,
        stat_value(c, "dfkv_rdma_mr_pool_ops_total"));
  CHECK(stat_value(c, "dfkv_rdma_mr_adhoc_registrations_total") == adhoc_before &&
            stat_value(c, "dfkv_rdma_staged_ops_total") == staged_before,
        "pool ops registered or staged memory");
  /* the ABI's transient MRs are never cached (C memory): all released, none held */
  CHECK(stat_value(c, "dfkv_rdma_mr_adhoc_registrations_total") > 0 &&
            stat_value(c, "dfkv_rdma_mr_adhoc_registrations_total") == stat_value(c, "dfkv_rdma_mr_adhoc_releases_total") &&
            stat_value(c, "dfkv_rdma_mr_cache_bytes") == 0,
        "transient MRs: %g registered, %g released, %g cached bytes",
        stat_value(c, "dfkv_rdma_mr_adhoc_registrations_total"), stat_value(c, "dfkv_rdma_mr_adhoc_releases_total"),
        stat_value(c, "dfkv_rdma_mr_cache_bytes"));
  CHECK(stat_value(c, "dfkv_rdma_v2_put_writes_total") >= 2 * NS + PN, "v2 put writes %g",
        stat_value(c, "dfkv_rdma_v2_put_writes_total"));
  CHECK(stat_value(c, "dfkv_rdma_completion_errors_total") == 0, "completion errors");
  /* one device, one PD and one registration of the pool, shared by the connections */
  CHECK(stat_value(c, "dfkv_rdma_devices_open") == 1 && stat_value(c, "dfkv_rdma_pds_open") == 1 &&
            stat_value(c, "dfkv_rdma_mr_pool_registrations_total") == 1,
        "devices %g, PDs %g, pool registrations %g (connections %g)", stat_value(c, "dfkv_rdma_devices_open"),
        stat_value(c, "dfkv_rdma_pds_open"), stat_value(c, "dfkv_rdma_mr_pool_registrations_total"),
        stat_value(c, "dfkv_rdma_v2_conns_opened_total"));
  /* unregister: deregistered once; the same range again, a range never registered and NULL are refused */
  CHECK(dfkv_unregister_memory(c, pool, (uint64_t)PN * PB) == 0, "unregister pool: %s", dfkv_last_error(c));
  CHECK(stat_value(c, "dfkv_rdma_mr_pool_deregistrations_total") == 1 && stat_value(c, "dfkv_rdma_mr_pool_bytes") == 0,
        "pool deregistrations %g, pool bytes %g", stat_value(c, "dfkv_rdma_mr_pool_deregistrations_total"),
        stat_value(c, "dfkv_rdma_mr_pool_bytes"));
  CHECK(dfkv_unregister_memory(c, pool, (uint64_t)PN * PB) == -1 && strstr(dfkv_last_error(c), "not registered") != NULL,
        "second unregister: '%s'", dfkv_last_error(c));
  CHECK(dfkv_unregister_memory(c, pool, PB) == -1, "unregister of a sub-range");
  CHECK(dfkv_unregister_memory(c, NULL, PB) == -1 && dfkv_unregister_memory(c, pool, 0) == -1, "unregister of NULL / 0 bytes");
  /* the range is plain malloc'd memory again: a batch from and into it is byte-exact, not pool ops */
  double pool_after = stat_value(c, "dfkv_rdma_mr_pool_ops_total");
  for (int i = 0; i < PN; i++) fill(pv[i], PB, 160u + (unsigned)i);
  CHECK(dfkv_batch_put(c, pk, pkl, (const void* const*)pv, pl, PN, ok) == 0, "unregistered pool batch_put");
  memset(pool, 0, (size_t)PN * PB);
  CHECK(dfkv_batch_get(c, pk, pkl, (void* const*)pv, pl, PN, ok) == 0, "unregistered pool batch_get");
  want = malloc(PB);
  for (int i = 0; i < PN; i++) {
    fill(want, PB, 160u + (unsigned)i);
    CHECK(ok[i] == 1 && memcmp(pv[i], want, PB) == 0, "unregistered pool batch item %d", i);
  }
  free(want);
  CHECK(stat_value(c, "dfkv_rdma_mr_pool_ops_total") == pool_after, "pool ops after unregister");
  free(pool); /* unregistered: the caller may free it while the client stays open */
  dmabuf_checks(c, 1);
  CHECK(dfkv_batch_remove(c, keys, klens, NS, ok) == 0 && ok[0] == 1 && dfkv_exist(c, keys[0], klens[0]) == 0,
        "rdma batch_remove");
  dfkv_close(c);
  for (int i = 0; i < NS; i++) {
    free(vals[i]);
    free(bufs[i]);
  }
}

int main(void) {
  const char* addr = getenv("DFKV_TEST_ADDR");
  if (!addr) {
    fprintf(stderr, "DFKV_TEST_ADDR not set\n");
    return 2;
  }
  char members[256];
  snprintf(members, sizeof members, "n1=%s", addr);
  CHECK(sizeof(dfkv_client_options_v2) == 88, "options struct is %zu bytes", sizeof(dfkv_client_options_v2));

  /* ---- dfkv_open_v2 refusals ---- */
  const char ns1[] = "tenant\0model-a";
  dfkv_client_options_v2 o = base_options(members, ns1, sizeof ns1 - 1);
  CHECK(dfkv_open_v2(NULL) == NULL, "NULL options accepted");
  o.struct_size = 40;
  CHECK(dfkv_open_v2(&o) == NULL, "short struct accepted");
  o.struct_size = sizeof o;
  o.abi_version = 1;
  CHECK(dfkv_open_v2(&o) == NULL, "abi_version 1 accepted");
  o.abi_version = DFKV_ABI_VERSION;
  o.flags = 1u << 7;
  CHECK(dfkv_open_v2(&o) == NULL, "unknown flag accepted");
  o.flags = 0;
  o.reserved0 = 1;
  CHECK(dfkv_open_v2(&o) == NULL, "nonzero reserved0 accepted");
  o.reserved0 = 0;
  o.members = NULL;
  CHECK(dfkv_open_v2(&o) == NULL, "neither members nor MDS accepted");
  CHECK(strstr(dfkv_last_error(NULL), "members") != NULL, "open refusal reason: '%s'", dfkv_last_error(NULL));
  CHECK(dfkv_last_status(NULL) == DFKV_STATUS_INVALID, "open refusal status: %d", dfkv_last_status(NULL));
  o.members = members;

  dfkv_client_t c = dfkv_open_v2(&o);
  CHECK(c != NULL, "open failed");
  if (!c) goto done;
  const char ns2[] = "tenant\0model-b";
  dfkv_client_options_v2 o2 = base_options(members, ns2, sizeof ns2 - 1);
  dfkv_client_t c2 = dfkv_open_v2(&o2);
  CHECK(c2 != NULL, "second open failed");

  CHECK(strcmp(dfkv_transport_mode(c), "tcp") == 0, "transport %s", dfkv_transport_mode(c));
  CHECK(dfkv_version() != NULL && dfkv_version()[0] != '\0', "empty version");
  unsigned char region[4096];
  CHECK(dfkv_register_memory(c, region, sizeof region) == 0, "register_memory on tcp");
  CHECK(dfkv_unregister_memory(c, region, sizeof region) == 0, "unregister_memory on tcp");
  CHECK(dfkv_unregister_memory(c, region, sizeof region) == -1 && dfkv_last_error(c)[0] != '\0',
        "second unregister_memory on tcp");
  dmabuf_checks(c2, 0); /* c2: its fast path goes off; c keeps it for the checks below */

  /* ---- single ops with binary keys ---- */
  const unsigned char key[] = {'k', 0, 1, 0xff, 0};
  size_t n = 300000;
  unsigned char* val = malloc(n);
  unsigned char* got = malloc(n + 100);
  fill(val, n, 1);
  CHECK(dfkv_put(c, key, sizeof key, val, n) == 0, "put");
  CHECK(dfkv_put(c, key, sizeof key, val, 0) == -1, "zero-length put accepted");
  CHECK(dfkv_exist(c, key, sizeof key) == 1, "exist");
  CHECK(dfkv_exist(c, key, sizeof key - 1) == 0, "prefix of a binary key exists");
  CHECK(dfkv_exist(c2, key, sizeof key) == 0, "namespace isolation broken");
  memset(got, 0, n);
  CHECK(dfkv_get(c, key, sizeof key, got, n) == 1 && memcmp(got, val, n) == 0, "exact get");
  CHECK(dfkv_get(c, key, sizeof key, got, n + 1) == 0, "exact get with a larger size hit");
  CHECK(dfkv_get(c, key, sizeof key, got, n - 1) == 0, "exact get with a smaller size hit");
  uint64_t out_len = 12345;
  memset(got, 0, n);
  CHECK(dfkv_get_auto(c, key, sizeof key, got, n + 100, &out_len) == 1 && out_len == n && memcmp(got, val, n) == 0,
        "get_auto");
  CHECK(dfkv_get_auto(c, key, sizeof key, got, n - 1, &out_len) == 0 && out_len == 0, "cap too small is not a miss");
  CHECK(dfkv_get(c2, key, sizeof key, got, n) == 0, "get across namespaces");
  CHECK(dfkv_remove(c, key, sizeof key) == 1, "remove");
  CHECK(dfkv_remove(c, key, sizeof key) == 1, "remove of an absent key is 1 (confirmed gone)");
  CHECK(dfkv_get(c, key, sizeof key, got, n) == 0, "get after remove");
  /* The exact get, the get_auto hit and the miss after remove were answered in C by the
   * GET fast path (fastget.c: binary key, NUL in the namespace); the size mismatches went
   * on to the Go client, which owns those answers. */
  const char* fastpath = getenv("DFKV_CABI_FASTPATH");
  if (fastpath == NULL || strcmp(fastpath, "0") != 0) {
    CHECK(stat_value(c, "dfkv_cabi_fast_gets_total") == 3, "fast path gets: %g",
          stat_value(c, "dfkv_cabi_fast_gets_total"));
    CHECK(stat_value(c, "dfkv_cabi_fast_fallbacks_total") == 3, "fast path fallbacks: %g",
          stat_value(c, "dfkv_cabi_fast_fallbacks_total"));
  }

  /* ---- dfkv_last_error: per handle, per thread; set by failures, kept by successes ---- */
  CHECK(strstr(dfkv_last_error(c), "not found") != NULL, "last error after a miss: '%s'", dfkv_last_error(c));
  CHECK(dfkv_last_status(c) == DFKV_STATUS_NOT_FOUND, "last status after a miss: %d", dfkv_last_status(c));
  CHECK(dfkv_put(c, key, sizeof key, val, n) == 0, "put again");
  CHECK(strstr(dfkv_last_error(c), "not found") != NULL, "a success must not clear the last error");
  CHECK(dfkv_last_status(c) == DFKV_STATUS_NOT_FOUND, "a success must not clear the last status");
  CHECK(dfkv_put(c, key, sizeof key, val, 0) == -1 && strstr(dfkv_last_error(c), "zero-length") != NULL,
        "last error of a zero-length put: '%s'", dfkv_last_error(c));
  CHECK(dfkv_last_status(c) == DFKV_STATUS_INVALID, "status of a zero-length put: %d", dfkv_last_status(c));
  CHECK(dfkv_get(c, key, sizeof key, got, n + 1) == 0 && strstr(dfkv_last_error(c), "buffer too small") != NULL,
        "last error of a wrong-size get: '%s'", dfkv_last_error(c));
  CHECK(dfkv_last_status(c) == DFKV_STATUS_BUFFER_TOO_SMALL, "status of a wrong-size get: %d", dfkv_last_status(c));
  /* c2's own last failure was its cross-namespace miss; c's later errors stay c's */
  CHECK(strstr(dfkv_last_error(c2), "not found") != NULL, "another handle's error leaked: '%s'", dfkv_last_error(c2));
  CHECK(dfkv_get(NULL, key, sizeof key, got, n) == 0 && strstr(dfkv_last_error(NULL), "handle") != NULL,
        "last error of a NULL handle: '%s'", dfkv_last_error(NULL));
  CHECK(dfkv_last_status(NULL) == DFKV_STATUS_CLOSED, "status of a NULL handle: %d", dfkv_last_status(NULL));
  {
    struct other_thread t = {.c = c};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, other_thread_main, &t) == 0 && pthread_join(th, NULL) == 0, "thread");
    CHECK(t.before[0] == '\0', "another thread's error leaked into a new thread: '%s'", t.before);
    CHECK(strstr(t.after, "not found") != NULL, "the thread's own miss: '%s'", t.after);
    CHECK(strstr(dfkv_last_error(c), "buffer too small") != NULL, "the thread's miss overwrote ours: '%s'",
          dfkv_last_error(c));
  }
  CHECK(dfkv_remove(c, key, sizeof key) == 1, "remove");
  CHECK(strcmp(dfkv_transport_mode(NULL), "") == 0, "transport mode of NULL: '%s'", dfkv_transport_mode(NULL));

  /* ---- batches with mixed hits and misses ---- */
  enum { N = 6 };
  char kbuf[N][8];
  const void* keys[N];
  uint64_t klens[N];
  unsigned char* vals[N];
  uint64_t vlens[N];
  int ok[N];
  for (int i = 0; i < N; i++) {
    snprintf(kbuf[i], sizeof kbuf[i], "b%d", i);
    keys[i] = kbuf[i];
    klens[i] = strlen(kbuf[i]);
    vlens[i] = 1000 + 5000 * (uint64_t)i;
    vals[i] = malloc(vlens[i]);
    fill(vals[i], vlens[i], 10 + i);
  }
  vlens[3] = 0; /* an invalid item fails alone */
  for (int i = 0; i < N; i++) ok[i] = 9;
  CHECK(dfkv_batch_put(c, keys, klens, (const void* const*)vals, vlens, N, ok) == 0, "batch_put");
  for (int i = 0; i < N; i++) CHECK(ok[i] == (i != 3), "batch_put item %d ok=%d", i, ok[i]);
  vlens[3] = 1000 + 5000 * 3;
  void* bufs[N];
  for (int i = 0; i < N; i++) bufs[i] = calloc(1, vlens[i] + 10);
  CHECK(dfkv_batch_get(c, keys, klens, bufs, vlens, N, ok) == 0, "batch_get");
  for (int i = 0; i < N; i++)
    CHECK(ok[i] == (i != 3) && (i == 3 || memcmp(bufs[i], vals[i], vlens[i]) == 0), "batch_get item %d", i);
  uint64_t caps[N], lens[N];
  for (int i = 0; i < N; i++) caps[i] = vlens[i] + 10;
  caps[1] = 10; /* too small: a miss */
  CHECK(dfkv_batch_get_auto(c, keys, klens, bufs, caps, N, ok, lens) == 0, "batch_get_auto");
  for (int i = 0; i < N; i++) {
    int want = i != 3 && i != 1;
    CHECK(ok[i] == want && lens[i] == (want ? vlens[i] : 0), "batch_get_auto item %d ok=%d len=%llu", i, ok[i],
          (unsigned long long)lens[i]);
  }
  CHECK(dfkv_batch_exist(c, keys, klens, N, ok) == 0, "batch_exist");
  for (int i = 0; i < N; i++) CHECK(ok[i] == (i != 3), "batch_exist item %d", i);
  /* the default slab server leases hits (1); key 3 is absent (0) */
  CHECK(dfkv_batch_exist_lease(c, keys, klens, N, 5000, ok) == 0, "batch_exist_lease");
  for (int i = 0; i < N; i++) CHECK(ok[i] == (i != 3), "batch_exist_lease item %d ok=%d", i, ok[i]);
  CHECK(dfkv_batch_exist_lease(c, keys, klens, N, 0, NULL) == -1, "NULL out_ok accepted by exist_lease");
  /* the test server runs with --max-msg 32MiB */
  CHECK(dfkv_max_value_size(c) == (32u << 20), "max_value_size %llu", (unsigned long long)dfkv_max_value_size(c));
  CHECK(dfkv_batch_remove(c, keys, klens, N, ok) == 0, "batch_remove");
  /* item 3 was never stored: absent counts as removed, like dfkv_remove */
  for (int i = 0; i < N; i++) CHECK(ok[i] == 1, "batch_remove item %d", i);
  CHECK(dfkv_batch_exist(c, keys, klens, N, ok) == 0 && ok[0] == 0, "exist after batch_remove");
  CHECK(dfkv_batch_get(c, keys, klens, bufs, vlens, N, ok) == 0 && strstr(dfkv_last_error(c), "item 0") != NULL,
        "a batch with failed items keeps the first one's reason: '%s'", dfkv_last_error(c));
  CHECK(dfkv_batch_get(c, keys, klens, bufs, vlens, -1, ok) == -1, "negative n accepted");
  CHECK(strstr(dfkv_last_error(c), "bad argument") != NULL, "last error of a refused batch: '%s'", dfkv_last_error(c));
  CHECK(dfkv_batch_get(c, keys, klens, bufs, vlens, N, NULL) == -1, "NULL out_ok accepted");

  /* ---- scatter-gather with uneven segments ---- */
  uint32_t maxsegs = dfkv_max_sg_segs(c);
  CHECK(maxsegs >= 2, "max_sg_segs %u", maxsegs);
  unsigned char whole[70001];
  fill(whole, sizeof whole, 99);
  const void* p0[3] = {whole, whole + 1, whole + 40000};
  uint64_t l0[3] = {1, 39999, sizeof whole - 40000};
  const char* sgk[2] = {"sg0", "sg1"};
  uint64_t sgkl[2] = {3, 3};
  /* item 1 claims more segments than allowed and must fail alone */
  uint32_t counts[2] = {3, maxsegs + 1};
  const void* const* segp[2] = {p0, p0};
  const uint64_t* segl[2] = {l0, l0};
  int sgok[2] = {9, 9};
  CHECK(dfkv_batch_put_sg(c, (const void* const*)sgk, sgkl, segp, segl, counts, 2, sgok) == 0, "batch_put_sg");
  CHECK(sgok[0] == 1 && sgok[1] == 0, "batch_put_sg items %d %d", sgok[0], sgok[1]);
  unsigned char a[3], b[50000], cc[7], d[30000];
  void* q0[4] = {a, b, cc, d};
  uint64_t ql[4] = {sizeof a, sizeof b, sizeof cc, sizeof d};
  void* const* segq[2] = {q0, q0};
  const uint64_t* segql[2] = {ql, ql};
  uint32_t qcounts[2] = {4, 4};
  uint64_t sglens[2] = {7, 7};
  CHECK(dfkv_batch_get_auto_sg(c, (const void* const*)sgk, sgkl, segq, segql, qcounts, 2, sgok, sglens) == 0,
        "batch_get_auto_sg");
  CHECK(sgok[0] == 1 && sglens[0] == sizeof whole && sgok[1] == 0 && sglens[1] == 0, "sg get items %d %llu %d", sgok[0],
        (unsigned long long)sglens[0], sgok[1]);
  unsigned char joined[sizeof a + sizeof b + sizeof cc + sizeof d];
  memcpy(joined, a, sizeof a);
  memcpy(joined + sizeof a, b, sizeof b);
  memcpy(joined + sizeof a + sizeof b, cc, sizeof cc);
  memcpy(joined + sizeof a + sizeof b + sizeof cc, d, sizeof d);
  CHECK(memcmp(joined, whole, sizeof whole) == 0, "sg bytes differ");

  /* ---- stats snapshot sizing ---- */
  uint64_t need = dfkv_stats_snapshot(c, NULL, 0);
  CHECK(need > 0, "stats size 0");
  char* text = malloc(need + 1);
  uint64_t again = dfkv_stats_snapshot(c, text, need);
  CHECK(again >= need, "stats length shrank");
  text[need] = '\0';
  CHECK(strstr(text, "dfkv_client_ops_total") != NULL, "stats text lacks ops");
  CHECK(strstr(text, "dfkv_cabi_panics_total 0") != NULL, "stats text lacks the (zero) panic counter");
  char small[8];
  CHECK(dfkv_stats_snapshot(c, small, sizeof small) >= need, "truncated snapshot must still report the full size");
  free(text);

  dfkv_close(c2);
  dfkv_close(c);
  /* ---- calls on NULL / closed clients fail cleanly ---- */
  CHECK(dfkv_put(NULL, key, sizeof key, val, n) == -1, "put on NULL client");
  CHECK(dfkv_get(c, key, sizeof key, got, n) == 0, "get on closed client");
  CHECK(dfkv_batch_exist(c, keys, klens, N, ok) == -1 && ok[0] == 0, "batch on closed client");
  CHECK(strcmp(dfkv_transport_mode(c), "closed") == 0, "transport mode of a closed client");
  CHECK(strstr(dfkv_last_error(c), "closed") != NULL, "last error on a closed client: '%s'", dfkv_last_error(c));
  CHECK(dfkv_max_sg_segs(c) == 0, "max_sg_segs of a closed client");
  CHECK(dfkv_unregister_memory(c, region, sizeof region) == -1, "unregister_memory on a closed client");
  CHECK(dfkv_unregister_dmabuf(c, 0x10000, 4096) == -1 && dfkv_last_status(c) == DFKV_STATUS_CLOSED,
        "unregister_dmabuf on a closed client: status %d", dfkv_last_status(c));
  CHECK(dfkv_max_value_size(c) == 0, "max_value_size of a closed client");
  CHECK(dfkv_batch_exist_lease(c, keys, klens, N, 0, ok) == -1 && ok[0] == 0, "exist_lease on closed client");
  dfkv_close(c); /* double close is harmless */
  for (int i = 0; i < N; i++) {
    free(vals[i]);
    free(bufs[i]);
  }
  free(val);
  free(got);
done:
  if (getenv("DFKV_TEST_RDMA_ADDR"))
    rdma_section(getenv("DFKV_TEST_RDMA_ADDR"));
  else
    printf("rdma section not run: DFKV_TEST_RDMA_ADDR unset\n");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
