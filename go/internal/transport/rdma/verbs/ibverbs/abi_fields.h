// Every size and offset of verbs_abi.h that the shim relies on, as an X-macro list:
// S(struct) for a struct's size, O(struct, field) for a field's offset. abicheck.c expands
// it once against verbs_abi.h and once against rdma-core's header (where installed).
#ifndef DFKV_ABI_FIELDS_H
#define DFKV_ABI_FIELDS_H
#define DFKV_ABI_FIELDS(S, O)                                                                  \
	S(ibv_gid_entry) O(ibv_gid_entry, gid_index) O(ibv_gid_entry, port_num)                  \
	O(ibv_gid_entry, gid_type) O(ibv_gid_entry, ndev_ifindex)                                \
	S(ibv_device_attr) O(ibv_device_attr, max_mr_size) O(ibv_device_attr, max_qp_wr)         \
	O(ibv_device_attr, max_sge) O(ibv_device_attr, max_cqe) O(ibv_device_attr, phys_port_cnt) \
	S(ibv_port_attr) O(ibv_port_attr, state) O(ibv_port_attr, active_mtu)                    \
	O(ibv_port_attr, gid_tbl_len) O(ibv_port_attr, lid) O(ibv_port_attr, phys_state)         \
	O(ibv_port_attr, link_layer)                                                             \
	S(ibv_pd) S(ibv_mr) O(ibv_mr, addr) O(ibv_mr, lkey) O(ibv_mr, rkey)                      \
	S(ibv_comp_channel) O(ibv_comp_channel, fd)                                              \
	S(ibv_cq) O(ibv_cq, context)                                                             \
	S(ibv_qp) O(ibv_qp, context) O(ibv_qp, qp_num)                                           \
	S(ibv_qp_cap) S(ibv_qp_init_attr) O(ibv_qp_init_attr, send_cq) O(ibv_qp_init_attr, recv_cq) \
	O(ibv_qp_init_attr, cap) O(ibv_qp_init_attr, qp_type) O(ibv_qp_init_attr, sq_sig_all)    \
	S(ibv_global_route) O(ibv_global_route, sgid_index) O(ibv_global_route, hop_limit)       \
	O(ibv_global_route, traffic_class)                                                       \
	S(ibv_ah_attr) O(ibv_ah_attr, dlid) O(ibv_ah_attr, is_global) O(ibv_ah_attr, port_num)   \
	S(ibv_qp_attr) O(ibv_qp_attr, qp_state) O(ibv_qp_attr, path_mtu) O(ibv_qp_attr, qkey)    \
	O(ibv_qp_attr, rq_psn) O(ibv_qp_attr, sq_psn) O(ibv_qp_attr, dest_qp_num)                \
	O(ibv_qp_attr, qp_access_flags) O(ibv_qp_attr, ah_attr) O(ibv_qp_attr, pkey_index)       \
	O(ibv_qp_attr, max_rd_atomic) O(ibv_qp_attr, max_dest_rd_atomic)                         \
	O(ibv_qp_attr, min_rnr_timer) O(ibv_qp_attr, port_num) O(ibv_qp_attr, timeout)           \
	O(ibv_qp_attr, retry_cnt) O(ibv_qp_attr, rnr_retry)                                      \
	S(ibv_sge) O(ibv_sge, length) O(ibv_sge, lkey)                                           \
	S(ibv_send_wr) O(ibv_send_wr, next) O(ibv_send_wr, sg_list) O(ibv_send_wr, num_sge)      \
	O(ibv_send_wr, opcode) O(ibv_send_wr, send_flags) O(ibv_send_wr, imm_data)               \
	O(ibv_send_wr, wr.rdma.remote_addr) O(ibv_send_wr, wr.rdma.rkey)                         \
	S(ibv_recv_wr) O(ibv_recv_wr, next) O(ibv_recv_wr, sg_list) O(ibv_recv_wr, num_sge)      \
	S(ibv_wc) O(ibv_wc, status) O(ibv_wc, opcode) O(ibv_wc, byte_len) O(ibv_wc, imm_data)    \
	O(ibv_wc, qp_num) O(ibv_wc, wc_flags)                                                    \
	S(ibv_context_ops) O(ibv_context_ops, poll_cq) O(ibv_context_ops, req_notify_cq)         \
	O(ibv_context_ops, post_send) O(ibv_context_ops, post_recv)                              \
	S(ibv_context) O(ibv_context, ops) O(ibv_context, cmd_fd) O(ibv_context, abi_compat)
#endif
