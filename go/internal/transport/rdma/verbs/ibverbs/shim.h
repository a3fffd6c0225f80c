// C side of the ibverbs provider: dlopen/dlsym'd entry points and flat wrappers that take
// no Go pointers to keep.
#ifndef DFKV_IBV_SHIM_H
#define DFKV_IBV_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include "verbs_abi.h"

// dfkv_ibv_load opens the library once; 0 on success, else -1 with a message in err.
int dfkv_ibv_load(const char *path, char *err, size_t errlen);
// dfkv_ibv_probe checks that path loads and has every entry point, without keeping it.
int dfkv_ibv_probe(const char *path, char *err, size_t errlen);

struct ibv_device **dfkv_ibv_get_device_list(int *n, int *err);
void dfkv_ibv_free_device_list(struct ibv_device **l);
const char *dfkv_ibv_get_device_name(struct ibv_device *d);
struct ibv_context *dfkv_ibv_open_device(struct ibv_device *d, int *err);
int dfkv_ibv_close_device(struct ibv_context *c);
int dfkv_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
int dfkv_ibv_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a);
int dfkv_ibv_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t gid[16]);
// One valid GID table entry (ibv_gid_entry, flattened).
struct dfkv_gid {
	uint8_t gid[16];
	uint32_t index;
	uint32_t port;
	uint32_t type; // enum ibv_gid_type: 0 IB, 1 RoCE v1, 2 RoCE v2
	uint32_t ifindex;
};
// dfkv_ibv_query_gid_table fills up to max entries of every port; the count, or -errno
// (-ENOSYS: the library predates ibv_query_gid_table, rdma-core < 29).
long dfkv_ibv_query_gid_table(struct ibv_context *c, struct dfkv_gid *out, long max);
struct ibv_pd *dfkv_ibv_alloc_pd(struct ibv_context *c, int *err);
int dfkv_ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *dfkv_ibv_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err);
int dfkv_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_mr *dfkv_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
				      int access, int *err);
struct ibv_comp_channel *dfkv_ibv_create_comp_channel(struct ibv_context *c, int *err);
int dfkv_ibv_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *dfkv_ibv_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch, int *err);
int dfkv_ibv_destroy_cq(struct ibv_cq *cq);
// dfkv_ibv_cq_event consumes one event from a non-blocking channel: 1 got one, 0 none.
int dfkv_ibv_cq_event(struct ibv_comp_channel *ch, int *err);
int dfkv_ibv_req_notify(struct ibv_cq *cq);

struct ibv_qp *dfkv_ibv_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
                                  uint32_t max_send_wr, uint32_t max_recv_wr,
                                  uint32_t max_send_sge, uint32_t max_recv_sge, int sig_all, int *err);
int dfkv_ibv_destroy_qp(struct ibv_qp *qp);
int dfkv_ibv_modify_init(struct ibv_qp *qp, uint8_t port, int access);
int dfkv_ibv_modify_rtr(struct ibv_qp *qp, uint8_t port, int mtu, uint32_t dest_qpn, uint32_t rq_psn,
                        const uint8_t gid[16], uint16_t lid, int global, uint8_t sgid_index,
                        uint8_t hop_limit, uint8_t traffic_class);
int dfkv_ibv_modify_rts(struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry, uint8_t rnr);
int dfkv_ibv_modify_state(struct ibv_qp *qp, int state);

// Flat work requests: plain values only. SGEs are ibv_sge laid out by the caller; each WR
// names its slice of them by offset and count.
struct dfkv_swr {
	uint64_t id;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm; // host order
	uint32_t opcode;
	uint32_t flags;
	uint32_t nsge;
	uint32_t sge_off;
};
struct dfkv_rwr {
	uint64_t id;
	uint32_t nsge;
	uint32_t sge_off;
};
struct dfkv_wc {
	uint64_t id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm; // host order
	uint32_t qp_num;
	uint32_t with_imm;
};
// Post n WRs as one chain; returns 0 or an errno, with *bad the index of the first WR not posted.
int dfkv_ibv_post_send(struct ibv_qp *qp, const struct dfkv_swr *w, int n, struct ibv_sge *sges, int *bad);
int dfkv_ibv_post_recv(struct ibv_qp *qp, const struct dfkv_rwr *w, int n, struct ibv_sge *sges, int *bad);
int dfkv_ibv_poll_cq(struct ibv_cq *cq, int n, struct dfkv_wc *out);
int dfkv_ibv_comp_fd(struct ibv_comp_channel *ch);

// verbs_abi.h's sizes and offsets (abi_fields.h order), and its enum values in
// dfkv_abi_real_enums' order: what TestABILayout compares with rdma-core's header.
size_t dfkv_abi_ours(size_t *out, size_t max);
const char *dfkv_abi_name(size_t i);
size_t dfkv_abi_our_enums(long *out, size_t max);
size_t dfkv_abi_real(size_t *out, size_t max);
size_t dfkv_abi_real_enums(long *out, size_t max);

#endif
