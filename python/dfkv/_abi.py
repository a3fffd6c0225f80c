"""ctypes declarations of the dfkv C ABI, generated from go/cmd/libdfkv/dfkv.h by
tools/gen_ctypes.py. Do not edit: change the header and rerun the generator
(tools/gen_ctypes.py --check, run by tools/test.sh, fails while this file is stale)."""

from ctypes import POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint32, c_uint64, c_void_p

__all__ = ["ABI_VERSION", "CLIENT_OPT_REGISTER_WITH_MDS", "CLIENT_OPT_RDMA", "STATUS_OK", "STATUS_NOT_FOUND", "STATUS_UNAVAILABLE", "STATUS_TIMEOUT", "STATUS_FORBIDDEN", "STATUS_TOO_LARGE", "STATUS_BUFFER_TOO_SMALL", "STATUS_CACHE_FULL", "STATUS_QUOTA_EXCEEDED", "STATUS_BUSY", "STATUS_IO_ERROR", "STATUS_INVALID", "STATUS_PROTOCOL", "STATUS_CLOSED", "STATUS_INTERNAL", "STATUS_DIRECT_UNSUPPORTED", "TAG_HASH_BYTES", "TAG_HASH_UINT64", "ClientOptionsV2", "BlockTag", "PROTOTYPES"]

# Constants (#define).
ABI_VERSION = 2
CLIENT_OPT_REGISTER_WITH_MDS = (1 << 0)
CLIENT_OPT_RDMA = (1 << 1)
STATUS_OK = 0
STATUS_NOT_FOUND = 1
STATUS_UNAVAILABLE = 2
STATUS_TIMEOUT = 3
STATUS_FORBIDDEN = 4
STATUS_TOO_LARGE = 5
STATUS_BUFFER_TOO_SMALL = 6
STATUS_CACHE_FULL = 7
STATUS_QUOTA_EXCEEDED = 8
STATUS_BUSY = 9
STATUS_IO_ERROR = 10
STATUS_INVALID = 11
STATUS_PROTOCOL = 12
STATUS_CLOSED = 13
STATUS_INTERNAL = 14
STATUS_DIRECT_UNSUPPORTED = 15
TAG_HASH_BYTES = (1 << 0)
TAG_HASH_UINT64 = (1 << 1)


class ClientOptionsV2(Structure):
    """``dfkv_client_options_v2`` from dfkv.h, field for field."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("members", c_char_p),
        ("key_namespace", c_void_p),
        ("key_namespace_len", c_uint64),
        ("batch_concurrency", c_uint64),
        ("mds_endpoints", c_char_p),
        ("mds_group", c_char_p),
        ("mds_poll_ms", c_int32),
        ("flags", c_uint32),
        ("client_id", c_char_p),
        ("client_info", c_char_p),
        ("client_heartbeat_ms", c_int32),
        ("reserved0", c_uint32),
    ]


class BlockTag(Structure):
    """``dfkv_block_tag`` from dfkv.h, field for field."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("key", c_void_p),
        ("key_len", c_uint64),
        ("model", c_char_p),
        ("hashes", c_void_p),
        ("n_hashes", c_uint32),
        ("hash_len", c_uint32),
        ("parent_hash", c_void_p),
        ("token_ids", POINTER(c_int32)),
        ("n_tokens", c_uint64),
        ("block_size", c_uint32),
        ("reserved0", c_uint32),
        ("lora_id", c_int64),
        ("lora_name", c_char_p),
    ]


# name -> (restype, argtypes), every function of dfkv.h in header order.
PROTOTYPES = {
    # dfkv_open_v2(options)
    "dfkv_open_v2": (c_void_p, [POINTER(ClientOptionsV2)]),
    # dfkv_close(c)
    "dfkv_close": (None, [c_void_p]),
    # dfkv_put(c, key, key_len, value, n)
    "dfkv_put": (c_int, [c_void_p, c_void_p, c_uint64, c_void_p, c_uint64]),
    # dfkv_get(c, key, key_len, buf, n)
    "dfkv_get": (c_int, [c_void_p, c_void_p, c_uint64, c_void_p, c_uint64]),
    # dfkv_get_auto(c, key, key_len, buf, cap, out_len)
    "dfkv_get_auto": (c_int, [c_void_p, c_void_p, c_uint64, c_void_p, c_uint64, POINTER(c_uint64)]),
    # dfkv_exist(c, key, key_len)
    "dfkv_exist": (c_int, [c_void_p, c_void_p, c_uint64]),
    # dfkv_remove(c, key, key_len)
    "dfkv_remove": (c_int, [c_void_p, c_void_p, c_uint64]),
    # dfkv_batch_put(c, keys, key_lens, values, value_lens, n, out_ok)
    "dfkv_batch_put": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_void_p), POINTER(c_uint64), c_int, POINTER(c_int)]),
    # dfkv_batch_get(c, keys, key_lens, bufs, lens, n, out_ok)
    "dfkv_batch_get": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_void_p), POINTER(c_uint64), c_int, POINTER(c_int)]),
    # dfkv_batch_get_auto(c, keys, key_lens, bufs, caps, n, out_ok, out_lens)
    "dfkv_batch_get_auto": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(c_void_p), POINTER(c_uint64), c_int, POINTER(c_int), POINTER(c_uint64)]),
    # dfkv_batch_exist(c, keys, key_lens, n, out_ok)
    "dfkv_batch_exist": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), c_int, POINTER(c_int)]),
    # dfkv_batch_remove(c, keys, key_lens, n, out_ok)
    "dfkv_batch_remove": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), c_int, POINTER(c_int)]),
    # dfkv_batch_put_sg(c, keys, key_lens, seg_ptrs, seg_lens, seg_counts, n, out_ok)
    "dfkv_batch_put_sg": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(POINTER(c_void_p)), POINTER(POINTER(c_uint64)), POINTER(c_uint32), c_int, POINTER(c_int)]),
    # dfkv_batch_get_auto_sg(c, keys, key_lens, seg_ptrs, seg_lens, seg_counts, n, out_ok, out_lens)
    "dfkv_batch_get_auto_sg": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), POINTER(POINTER(c_void_p)), POINTER(POINTER(c_uint64)), POINTER(c_uint32), c_int, POINTER(c_int), POINTER(c_uint64)]),
    # dfkv_max_sg_segs(c)
    "dfkv_max_sg_segs": (c_uint32, [c_void_p]),
    # dfkv_register_memory(c, base, size)
    "dfkv_register_memory": (c_int, [c_void_p, c_void_p, c_uint64]),
    # dfkv_unregister_memory(c, base, size)
    "dfkv_unregister_memory": (c_int, [c_void_p, c_void_p, c_uint64]),
    # dfkv_transport_mode(c)
    "dfkv_transport_mode": (c_char_p, [c_void_p]),
    # dfkv_stats_snapshot(c, buf, cap)
    "dfkv_stats_snapshot": (c_uint64, [c_void_p, c_char_p, c_uint64]),
    # dfkv_version()
    "dfkv_version": (c_char_p, []),
    # dfkv_last_error(c)
    "dfkv_last_error": (c_char_p, [c_void_p]),
    # dfkv_batch_exist_lease(c, keys, key_lens, n, lease_ms, out_ok)
    "dfkv_batch_exist_lease": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_uint64), c_int, c_uint32, POINTER(c_int)]),
    # dfkv_max_value_size(c)
    "dfkv_max_value_size": (c_uint64, [c_void_p]),
    # dfkv_last_status(c)
    "dfkv_last_status": (c_int, [c_void_p]),
    # dfkv_tag(c, tags, n)
    "dfkv_tag": (c_int, [c_void_p, POINTER(BlockTag), c_int]),
    # dfkv_register_dmabuf(c, fd, offset, size, iova)
    "dfkv_register_dmabuf": (c_int, [c_void_p, c_int, c_uint64, c_uint64, c_uint64]),
    # dfkv_unregister_dmabuf(c, iova, size)
    "dfkv_unregister_dmabuf": (c_int, [c_void_p, c_uint64, c_uint64]),
}
