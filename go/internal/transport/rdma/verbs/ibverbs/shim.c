//go:build linux && cgo

#include "shim.h"
#include "abi_fields.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Entry points resolved from the library. The exported ibv_query_port takes the old
// (compat) port attribute struct, a prefix of today's struct ibv_port_attr.
struct fns {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
	// Optional (NULL when the library lacks it): rdma-core >= 34.
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	// Optional (NULL when the library lacks it): rdma-core >= 29.
	ssize_t (*query_gid_table)(struct ibv_context *, struct ibv_gid_entry *, size_t, uint32_t, size_t);
};
static struct fns fn;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static void *lib;

#define RESOLVE(field, name)                                                   \
	do {                                                                   \
		*(void **)(&t->field) = dlsym(h, name);                        \
		if (!t->field) {                                               \
			snprintf(err, errlen, "dlsym %s in %s: %s", name, path, \
				 dlerror());                                   \
			return -1;                                             \
		}                                                              \
	} while (0)

static int resolve_all(void *h, const char *path, struct fns *t, char *err, size_t errlen) {
	RESOLVE(get_device_list, "ibv_get_device_list");
	RESOLVE(free_device_list, "ibv_free_device_list");
	RESOLVE(get_device_name, "ibv_get_device_name");
	RESOLVE(open_device, "ibv_open_device");
	RESOLVE(close_device, "ibv_close_device");
	RESOLVE(query_device, "ibv_query_device");
	RESOLVE(query_port, "ibv_query_port");
	RESOLVE(query_gid, "ibv_query_gid");
	RESOLVE(alloc_pd, "ibv_alloc_pd");
	RESOLVE(dealloc_pd, "ibv_dealloc_pd");
	RESOLVE(reg_mr, "ibv_reg_mr");
	RESOLVE(dereg_mr, "ibv_dereg_mr");
	RESOLVE(create_comp_channel, "ibv_create_comp_channel");
	RESOLVE(destroy_comp_channel, "ibv_destroy_comp_channel");
	RESOLVE(create_cq, "ibv_create_cq");
	RESOLVE(destroy_cq, "ibv_destroy_cq");
	RESOLVE(get_cq_event, "ibv_get_cq_event");
	RESOLVE(ack_cq_events, "ibv_ack_cq_events");
	RESOLVE(create_qp, "ibv_create_qp");
	RESOLVE(modify_qp, "ibv_modify_qp");
	RESOLVE(destroy_qp, "ibv_destroy_qp");
	*(void **)(&t->query_gid_table) = dlsym(h, "_ibv_query_gid_table");
	*(void **)(&t->reg_dmabuf_mr) = dlsym(h, "ibv_reg_dmabuf_mr");
	return 0;
}

int dfkv_ibv_load(const char *path, char *err, size_t errlen) {
	pthread_mutex_lock(&load_mu);
	if (lib) {
		pthread_mutex_unlock(&load_mu);
		return 0;
	}
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
		pthread_mutex_unlock(&load_mu);
		return -1;
	}
	struct fns t;
	if (resolve_all(h, path, &t, err, errlen) != 0) {
		dlclose(h);
		pthread_mutex_unlock(&load_mu);
		return -1;
	}
	fn = t;
	lib = h;
	pthread_mutex_unlock(&load_mu);
	return 0;
}

int dfkv_ibv_probe(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
		return -1;
	}
	struct fns t;
	int rc = resolve_all(h, path, &t, err, errlen);
	dlclose(h);
	return rc;
}

struct ibv_device **dfkv_ibv_get_device_list(int *n, int *err) {
	errno = 0;
	struct ibv_device **l = fn.get_device_list(n);
	*err = errno;
	return l;
}
void dfkv_ibv_free_device_list(struct ibv_device **l) { fn.free_device_list(l); }
const char *dfkv_ibv_get_device_name(struct ibv_device *d) { return fn.get_device_name(d); }

struct ibv_context *dfkv_ibv_open_device(struct ibv_device *d, int *err) {
	errno = 0;
	struct ibv_context *c = fn.open_device(d);
	*err = errno;
	return c;
}
int dfkv_ibv_close_device(struct ibv_context *c) { return fn.close_device(c); }
int dfkv_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) { return fn.query_device(c, a); }

int dfkv_ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	memset(a, 0, sizeof *a);
	return fn.query_port(c, port, a);
}

int dfkv_ibv_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t gid[16]) {
	union ibv_gid g;
	int rc = fn.query_gid(c, port, index, &g);
	if (rc == 0)
		memcpy(gid, g.raw, 16);
	return rc;
}

long dfkv_ibv_query_gid_table(struct ibv_context *c, struct dfkv_gid *out, long max) {
	if (!fn.query_gid_table)
		return -ENOSYS;
	if (max <= 0)
		return 0;
	struct ibv_gid_entry *e = calloc((size_t)max, sizeof *e);
	if (!e)
		return -ENOMEM;
	errno = 0;
	ssize_t n = fn.query_gid_table(c, e, (size_t)max, 0, sizeof *e);
	if (n < 0) {
		int err = errno ? errno : (int)-n;
		free(e);
		return -(long)err;
	}
	for (ssize_t i = 0; i < n; i++) {
		memcpy(out[i].gid, e[i].gid.raw, 16);
		out[i].index = e[i].gid_index;
		out[i].port = e[i].port_num;
		out[i].type = e[i].gid_type;
		out[i].ifindex = e[i].ndev_ifindex;
	}
	free(e);
	return (long)n;
}

struct ibv_pd *dfkv_ibv_alloc_pd(struct ibv_context *c, int *err) {
	errno = 0;
	struct ibv_pd *pd = fn.alloc_pd(c);
	*err = errno;
	return pd;
}
int dfkv_ibv_dealloc_pd(struct ibv_pd *pd) { return fn.dealloc_pd(pd); }

struct ibv_mr *dfkv_ibv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err) {
	errno = 0;
	struct ibv_mr *mr = fn.reg_mr(pd, (void *)addr, len, access);
	*err = errno;
	return mr;
}
int dfkv_ibv_dereg_mr(struct ibv_mr *mr) { return fn.dereg_mr(mr); }

// dfkv_ibv_reg_dmabuf_mr: *err = -1 when the library has no ibv_reg_dmabuf_mr.
struct ibv_mr *dfkv_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
				      int access, int *err) {
	if (!fn.reg_dmabuf_mr) {
		*err = -1;
		return NULL;
	}
	errno = 0;
	struct ibv_mr *mr = fn.reg_dmabuf_mr(pd, offset, len, iova, fd, access);
	*err = errno;
	return mr;
}

struct ibv_comp_channel *dfkv_ibv_create_comp_channel(struct ibv_context *c, int *err) {
	errno = 0;
	struct ibv_comp_channel *ch = fn.create_comp_channel(c);
	*err = errno;
	if (ch) {
		int fl = fcntl(ch->fd, F_GETFL);
		if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
			*err = errno;
			fn.destroy_comp_channel(ch);
			return NULL;
		}
	}
	return ch;
}
int dfkv_ibv_destroy_comp_channel(struct ibv_comp_channel *ch) { return fn.destroy_comp_channel(ch); }
int dfkv_ibv_comp_fd(struct ibv_comp_channel *ch) { return ch->fd; }

struct ibv_cq *dfkv_ibv_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch, int *err) {
	errno = 0;
	struct ibv_cq *cq = fn.create_cq(c, cqe, NULL, ch, 0);
	*err = errno;
	return cq;
}
int dfkv_ibv_destroy_cq(struct ibv_cq *cq) { return fn.destroy_cq(cq); }

int dfkv_ibv_cq_event(struct ibv_comp_channel *ch, int *err) {
	struct ibv_cq *cq;
	void *ctx;
	*err = 0;
	if (fn.get_cq_event(ch, &cq, &ctx) != 0) {
		*err = errno;
		return 0;
	}
	fn.ack_cq_events(cq, 1);
	return 1;
}

// ibv_req_notify_cq is the header's inline wrapper (through the context's ops table).
int dfkv_ibv_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

struct ibv_qp *dfkv_ibv_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
                                  uint32_t max_send_wr, uint32_t max_recv_wr,
                                  uint32_t max_send_sge, uint32_t max_recv_sge, int sig_all, int *err) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = sig_all;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_recv_sge = max_recv_sge;
	errno = 0;
	struct ibv_qp *qp = fn.create_qp(pd, &a);
	*err = errno;
	return qp;
}
int dfkv_ibv_destroy_qp(struct ibv_qp *qp) { return fn.destroy_qp(qp); }

int dfkv_ibv_modify_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return fn.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int dfkv_ibv_modify_rtr(struct ibv_qp *qp, uint8_t port, int mtu, uint32_t dest_qpn, uint32_t rq_psn,
                        const uint8_t gid[16], uint16_t lid, int global, uint8_t sgid_index,
                        uint8_t hop_limit, uint8_t traffic_class) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = port;
	if (global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
		a.ah_attr.grh.hop_limit = hop_limit;
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.traffic_class = traffic_class;
	}
	return fn.modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int dfkv_ibv_modify_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry, uint8_t rnr) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr;
	a.max_rd_atomic = 1;
	return fn.modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				    IBV_QP_MAX_QP_RD_ATOMIC);
}

int dfkv_ibv_modify_state(struct ibv_qp *qp, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = (enum ibv_qp_state)state;
	return fn.modify_qp(qp, &a, IBV_QP_STATE);
}

int dfkv_ibv_post_send(struct ibv_qp *qp, const struct dfkv_swr *w, int n, struct ibv_sge *sges, int *bad) {
	*bad = 0;
	if (n <= 0)
		return 0;
	struct ibv_send_wr *wrs = calloc((size_t)n, sizeof *wrs);
	if (!wrs)
		return ENOMEM;
	for (int i = 0; i < n; i++) {
		wrs[i].wr_id = w[i].id;
		wrs[i].opcode = (enum ibv_wr_opcode)w[i].opcode;
		wrs[i].send_flags = w[i].flags;
		wrs[i].sg_list = w[i].nsge ? &sges[w[i].sge_off] : NULL;
		wrs[i].num_sge = (int)w[i].nsge;
		wrs[i].wr.rdma.remote_addr = w[i].raddr;
		wrs[i].wr.rdma.rkey = w[i].rkey;
		wrs[i].imm_data = htonl(w[i].imm);
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_send_wr *badwr = NULL;
	int rc = ibv_post_send(qp, wrs, &badwr); // copies the WQEs; nothing is kept
	if (rc && badwr)
		*bad = (int)(badwr - wrs);
	free(wrs);
	return rc;
}

int dfkv_ibv_post_recv(struct ibv_qp *qp, const struct dfkv_rwr *w, int n, struct ibv_sge *sges, int *bad) {
	*bad = 0;
	if (n <= 0)
		return 0;
	struct ibv_recv_wr *wrs = calloc((size_t)n, sizeof *wrs);
	if (!wrs)
		return ENOMEM;
	for (int i = 0; i < n; i++) {
		wrs[i].wr_id = w[i].id;
		wrs[i].sg_list = w[i].nsge ? &sges[w[i].sge_off] : NULL;
		wrs[i].num_sge = (int)w[i].nsge;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_recv_wr *badwr = NULL;
	int rc = ibv_post_recv(qp, wrs, &badwr);
	if (rc && badwr)
		*bad = (int)(badwr - wrs);
	free(wrs);
	return rc;
}

int dfkv_ibv_poll_cq(struct ibv_cq *cq, int n, struct dfkv_wc *out) {
	struct ibv_wc wc[32];
	if (n > 32)
		n = 32;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].with_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0;
		out[i].imm = out[i].with_imm ? ntohl(wc[i].imm_data) : 0;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

#define S(t) sizeof(struct t),
#define O(t, f) offsetof(struct t, f),
static const size_t our_vals[] = {DFKV_ABI_FIELDS(S, O)};
#undef S
#undef O

#define S(t) "sizeof " #t,
#define O(t, f) #t "." #f,
static const char *const abi_names[] = {DFKV_ABI_FIELDS(S, O)};
#undef S
#undef O

const char *dfkv_abi_name(size_t i) { return i < sizeof abi_names / sizeof abi_names[0] ? abi_names[i] : "?"; }

size_t dfkv_abi_ours(size_t *out, size_t max) {
	size_t n = sizeof our_vals / sizeof our_vals[0];
	for (size_t i = 0; i < n && i < max; i++)
		out[i] = our_vals[i];
	return n;
}

size_t dfkv_abi_our_enums(long *out, size_t max) {
	const long v[] = {IBV_MTU_256, IBV_MTU_4096, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, IBV_QPT_RC,
			  IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR, IBV_QP_STATE, IBV_QP_ACCESS_FLAGS,
			  IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_TIMEOUT,
			  IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN, IBV_QP_MAX_QP_RD_ATOMIC,
			  IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_DEST_QPN,
			  IBV_WC_WITH_IMM, DFKV_IBV_GID_TYPE_ROCE_V2};
	size_t n = sizeof v / sizeof v[0];
	for (size_t i = 0; i < n && i < max; i++)
		out[i] = v[i];
	return n;
}
