"""Engine-independent connector pieces (dfkv.connectors._common); runs without any engine."""

from __future__ import annotations

import ctypes
import os

import pytest

from dfkv.connectors._common import (
    ClientConfig,
    LazyClient,
    get_segments,
    leading_hits,
    page_hash_bytes,
    put_segments,
)


def test_config_prefixes_env_and_types(monkeypatch):
    monkeypatch.setenv("DFKV_MEMBERS", "n9=h:1")
    c = ClientConfig.from_mapping({"remote_storage_plugin.dfkv.members": "n1=a:1", "dfkv.batch_concurrency": "8",
                                   "register_with_mds": "false", "client_info": {"engine": "x"}},
                                  prefixes=("remote_storage_plugin.dfkv.", "dfkv.", ""))
    assert c.members == "n1=a:1" and c.batch_concurrency == 8 and c.register_with_mds is False
    assert c.client_info == "engine=x"
    assert ClientConfig.from_mapping({}).members == "n9=h:1"
    monkeypatch.delenv("DFKV_MEMBERS")
    with pytest.raises(ValueError, match="no dfkv nodes configured"):
        ClientConfig.from_mapping({}).require_endpoints("x")


def test_page_hash_bytes():
    assert page_hash_bytes("ab") == b"ab"
    assert page_hash_bytes(b"\x00") == b"\x00"
    assert page_hash_bytes(-1) == b"\xff" and page_hash_bytes(255) == b"\xff\x00"
    assert len(page_hash_bytes("x" * 300)) == 7 + 32
    assert leading_hits([True, True, False, True]) == 2 and leading_hits([]) == 0


@pytest.mark.server
def test_segments_beyond_the_sg_limit_use_a_bounce_buffer(members):
    """Items with more segments than dfkv_max_sg_segs still store one object (gathered in a
    bounce buffer); items within the limit go through the scatter-gather ABI."""
    from dfkv import RawBuffer

    lc = LazyClient(ClientConfig(members=members), namespace=b"conn-common\x00" + os.urandom(8))
    c = lc.get()
    limit = c.max_sg_segs
    n_big, n_small = limit + 44, 3
    src = (ctypes.c_char * ((n_big + n_small) * 16)).from_buffer_copy(os.urandom((n_big + n_small) * 16))
    base = ctypes.addressof(src)
    big = [RawBuffer(base + i * 16, 16) for i in range(n_big)]
    small = [RawBuffer(base + (n_big + i) * 16, 16) for i in range(n_small)]
    assert put_segments(c, [b"big", b"small"], [big, small]) == [True, True]
    assert c.get_auto(b"big", 1 << 20) == bytes(src)[: n_big * 16]
    dst = (ctypes.c_char * len(src))()
    d = ctypes.addressof(dst)
    back_big = [RawBuffer(d + i * 16, 16) for i in range(n_big)]
    back_small = [RawBuffer(d + (n_big + i) * 16, 16) for i in range(n_small)]
    assert get_segments(c, [b"big", b"small", b"none"], [back_big, back_small, back_small]) == [True, True, False]
    assert bytes(dst) == bytes(src)
    short = [RawBuffer(d, 8)]  # stored value longer than the segments: a miss
    assert get_segments(c, [b"small"], [short]) == [False]
    lc.close()
    assert lc.get() is None


@pytest.mark.server
def test_forked_child_gets_one_clear_error(members):
    """A worker forked after its parent loaded libdfkv: one error that says what to do, then
    misses without retrying (no log line every reopen interval)."""
    import multiprocessing

    parent = LazyClient(ClientConfig(members=members, reopen_interval_s=0.0), b"fork-test")
    assert parent.get() is not None  # the parent loaded the library and opened a client
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        import logging

        records = []

        class H(logging.Handler):
            def emit(self, r):
                records.append((r.levelname, r.getMessage()))

        lg = logging.getLogger("dfkv.connectors")
        lg.addHandler(H())
        lg.setLevel(logging.DEBUG)
        lc = LazyClient(ClientConfig(members=members, reopen_interval_s=0.0), b"fork-test", name="child")
        got = [lc.get() for _ in range(5)] + [parent.get()]
        q.put((got.count(None), records))

    p = ctx.Process(target=child)
    p.start()
    nones, records = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert nones == 6  # the child's own client never opens; the inherited one is dropped too
    errors = [m for lvl, m in records if lvl == "ERROR"]
    assert len(errors) == 2, records  # once per LazyClient, not once per attempt
    assert "fork" in errors[0] and "spawn" in errors[0]
    parent.close()


def test_failed_calls_log_rate_limited(caplog):
    from dfkv.connectors._common import safe_call

    def boom():
        raise RuntimeError("node down")

    with caplog.at_level("WARNING", logger="dfkv.connectors"):
        for _ in range(50):
            assert safe_call("rate-limit-test", 0, boom) == 0
    assert len([r for r in caplog.records if "rate-limit-test" in r.getMessage()]) == 1
