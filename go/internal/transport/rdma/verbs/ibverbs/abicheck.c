//go:build linux && cgo

// The sizes and offsets of rdma-core's own <infiniband/verbs.h>, where it is installed, for
// TestABILayout to compare with verbs_abi.h's (shim.c). This file alone includes the real
// header; without it dfkv_abi_real reports 0 entries and the test skips.
#include <stddef.h>
#include "abi_fields.h"

#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define DFKV_HAVE_REAL_VERBS 1
#endif
#endif

#ifdef DFKV_HAVE_REAL_VERBS
#define S(t) sizeof(struct t),
#define O(t, f) offsetof(struct t, f),
static const size_t real_vals[] = {DFKV_ABI_FIELDS(S, O)};
#undef S
#undef O
#endif

// dfkv_abi_real copies at most max values; it returns how many there are (0: no header).
size_t dfkv_abi_real(size_t *out, size_t max) {
#ifdef DFKV_HAVE_REAL_VERBS
	size_t n = sizeof real_vals / sizeof real_vals[0];
	for (size_t i = 0; i < n && i < max; i++)
		out[i] = real_vals[i];
	return n;
#else
	(void)out;
	(void)max;
	return 0;
#endif
}

// dfkv_abi_real_enums fills the real header's values of the enums the shim uses, in the
// order of dfkv_abi_our_enums (shim.c); 0 without the header.
size_t dfkv_abi_real_enums(long *out, size_t max) {
#ifdef DFKV_HAVE_REAL_VERBS
	const long v[] = {IBV_MTU_256, IBV_MTU_4096, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, IBV_QPT_RC,
			  IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR, IBV_QP_STATE, IBV_QP_ACCESS_FLAGS,
			  IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_TIMEOUT,
			  IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN, IBV_QP_MAX_QP_RD_ATOMIC,
			  IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_DEST_QPN,
			  IBV_WC_WITH_IMM, IBV_GID_TYPE_ROCE_V2};
	size_t n = sizeof v / sizeof v[0];
	for (size_t i = 0; i < n && i < max; i++)
		out[i] = v[i];
	return n;
#else
	(void)out;
	(void)max;
	return 0;
#endif
}
