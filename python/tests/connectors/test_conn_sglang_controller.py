"""The dfkv HiCache backend under SGLang's own HiCacheController code (sglang 0.5.23).

The controller is created without its device pools, threads and process groups
(``HiCacheController.__new__``: building it whole needs a GPU KV pool and torch.distributed);
everything it then runs is SGLang's code: ``_storage_hit_query`` (page hashing with
``get_storage_hash_str`` and ``batch_exists``), and the page get/set functions that
``attach_storage_backend`` selects for a ``dynamic`` backend (cache_controller.py:646-667:
``_page_get_zero_copy``/``_page_set_zero_copy`` when ``interface_v1`` is set in the extra
config, else ``_generic_page_get``/``_generic_page_set``); that selection is repeated here
line for line because it is inline in attach_storage_backend. The backend is built by SGLang's
real StorageBackendFactory; the host pool is engine_support's MirrorMHAHostPool.
"""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("sglang.srt.managers.cache_controller",
                    reason="sglang (and its controller's imports) are not installed")

import torch  # noqa: E402
from engine_support import MirrorMHAHostPool, sglang_backend  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation  # noqa: E402

pytestmark = pytest.mark.server

PAGE = 4
TOKENS = list(range(1000, 1000 + 5 * PAGE))  # five pages


def _controller(backend, pool):
    c = HiCacheController.__new__(HiCacheController)
    c.storage_backend, c.storage_host_pool, c.mem_pool_host = backend, pool, pool
    c.page_size, c.storage_backend_type, c.storage_config = PAGE, "dynamic", backend.storage_config
    # cache_controller.py:646-667, the page function selection for a dynamic backend
    c.page_get_func, c.page_set_func = c._generic_page_get, c._generic_page_set
    if c.storage_backend_type == "dynamic" and bool(c.storage_config.extra_config.get("interface_v1", 0)):
        c.page_get_func, c.page_set_func = c._page_get_zero_copy, c._page_set_zero_copy
    return c


@pytest.mark.parametrize("interface_v1", [0, 1], ids=["interface_v0-default", "interface_v1"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_both_interfaces_hit(members, interface_v1, layout):
    tenant = "t-" + uuid.uuid4().hex[:12]
    src = MirrorMHAHostPool(layer_num=2, head_num=2, head_dim=8, page_size=PAGE, size=64, layout=layout)
    src.fill(11)
    wc = _controller(sglang_backend(members, tenant, src, extra={"interface_v1": interface_v1}), src)
    op = PrefetchOperation("w", TOKENS)
    hashes, _ = wc._storage_hit_query(op)
    assert hashes == []  # nothing stored yet
    host = torch.arange(len(TOKENS), dtype=torch.int64)
    assert wc.page_set_func(op.all_hash_values, host)

    dst = MirrorMHAHostPool(layer_num=2, head_num=2, head_dim=8, page_size=PAGE, size=64, layout=layout)
    rc = _controller(sglang_backend(members, tenant, dst, extra={"interface_v1": interface_v1}), dst)
    rop = PrefetchOperation("r", TOKENS)
    hashes, n_tokens = rc._storage_hit_query(rop)
    assert n_tokens == len(TOKENS) and len(hashes) == 5
    assert rc.page_get_func(rop, hashes, host) == 5
    for p in range(5):
        assert torch.equal(dst.get_data_page(p * PAGE), src.get_data_page(p * PAGE))


class AnchorPool:
    """DeepSeek-V4's logical KV anchor as SGLang builds it: it owns page indices but no KV
    buffer (``kv_buffer is None``); sidecar pools carry the data."""

    kv_buffer = None
    layout = "page_first"
    page_size = PAGE
    dtype = torch.bfloat16

    def get_page_buffer_meta(self, indices):
        return [], []


def test_v4_logical_anchor_counts_pages(members):
    tenant = "t-" + uuid.uuid4().hex[:12]
    pool = AnchorPool()
    c = _controller(sglang_backend(members, tenant, pool, extra={"interface_v1": 1}), pool)
    op = PrefetchOperation("a", TOKENS)
    hashes, n_tokens = c._storage_hit_query(op)
    assert n_tokens == len(TOKENS)  # every anchor page "exists", like Mooncake's backend
    host = torch.arange(len(TOKENS), dtype=torch.int64)
    assert c.page_get_func(op, hashes, host) == 5
    assert c.page_set_func(hashes, host)


def test_oversized_page_refuses_at_start(small_server):
    # a 512-byte page (2 layers x K/V x 4 tokens x 2 heads x 8 x bf16); the server takes 300
    pool = MirrorMHAHostPool(layer_num=2, head_num=2, head_dim=8, page_size=PAGE, size=64)
    with pytest.raises(ValueError, match=r"KV page object is 512 bytes .* --max-msg 512"):
        sglang_backend(f"n1={small_server}", "t-size", pool, extra={"interface_v1": 1})
