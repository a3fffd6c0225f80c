"""The binding against the real libdfkv.so and a real dfkv_server: every C ABI function through
``dfkv.Client`` (and raw where the binding cannot reach an error path), misses vs misuse,
zero-copy buffers, batches, scatter-gather."""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import threading
import time

import pytest

import dfkv
from dfkv import Client, DfkvError, RawBuffer
from dfkv._lib import ClientOptionsV2

try:
    import numpy as np
except ImportError:
    np = None

pytestmark = pytest.mark.server


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(n)) if n <= 4096 else os.urandom(n)


# -- open / close / introspection ---------------------------------------------------------


def test_version_and_transport(client):
    assert isinstance(dfkv.version(), str) and dfkv.version()
    assert client.version() == dfkv.version()
    assert client.transport_mode == "tcp"
    assert client.max_sg_segs >= 1
    assert "tcp" in repr(client)


def test_close_is_idempotent_and_closed_client_is_misuse(members):
    c = Client(members, namespace=b"x")
    c.close()
    c.close()
    assert c.closed and c.transport_mode == "closed"
    for call in (lambda: c.put(b"k", b"v"), lambda: c.get(b"k", 1), lambda: c.exist(b"k"),
                 lambda: c.batch_exist([b"k"]), lambda: c.max_sg_segs, lambda: c.stats_snapshot(),
                 lambda: c.register_memory(bytearray(8))):
        with pytest.raises(DfkvError, match="closed"):
            call()
    with Client(members) as c2:
        assert c2.put(b"ctx", b"v")
    assert c2.closed


@pytest.mark.parametrize("kw", [
    {},                                        # neither members nor MDS endpoints
    {"members": ""},
])
def test_open_refused_is_dfkv_error(lib, kw):
    with pytest.raises(DfkvError, match="dfkv_open_v2"):
        Client(**kw)


def _raw_open(lib, members: bytes, **fields):
    o = ClientOptionsV2()
    o.struct_size = ctypes.sizeof(o)
    o.abi_version = 2
    o.members = members
    for k, v in fields.items():
        setattr(o, k, v)
    return lib.dfkv_open_v2(ctypes.byref(o))


def test_open_v2_rejects_bad_structs(lib):
    m = b"n1=127.0.0.1:1"  # opening does not connect
    h = _raw_open(lib, m)
    assert h, "valid options must open"
    lib.dfkv_close(h)
    assert not lib.dfkv_open_v2(None)
    assert not _raw_open(lib, m, struct_size=ctypes.sizeof(ClientOptionsV2) - 8)
    assert not _raw_open(lib, m, struct_size=0)
    assert not _raw_open(lib, m, abi_version=1)
    assert not _raw_open(lib, m, abi_version=3)
    assert not _raw_open(lib, m, flags=1 << 5)
    assert not _raw_open(lib, m, reserved0=1)
    assert not _raw_open(lib, None)


def test_null_client_is_failure_not_crash(lib):
    assert lib.dfkv_transport_mode(None) == b""           # the original dfkv ABI's answer
    lib.dfkv_close(None)
    assert lib.dfkv_put(None, b"k", 1, b"v", 1) == -1
    assert lib.dfkv_get(None, b"k", 1, ctypes.create_string_buffer(1), 1) == 0
    assert lib.dfkv_exist(None, b"k", 1) == 0
    assert lib.dfkv_remove(None, b"k", 1) == 0
    assert b"handle" in lib.dfkv_last_error(None)
    out = (ctypes.c_int * 1)(7)
    keys = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.c_char_p(b"k"), ctypes.c_void_p).value)
    lens = (ctypes.c_uint64 * 1)(1)
    assert lib.dfkv_batch_exist(None, keys, lens, 1, out) == -1


def test_stats_snapshot(client):
    client.put(b"s", b"v")
    text = client.stats_snapshot()
    assert isinstance(text, str) and "dfkv" in text
    # Raw: cap 0 sizes the text; a short buffer gets a prefix and never an overrun.
    lib = dfkv._lib.load()
    h = client._acquire()
    try:
        n = lib.dfkv_stats_snapshot(h, None, 0)
        assert n > 0
        buf = ctypes.create_string_buffer(b"\xee" * 16, 16)
        assert lib.dfkv_stats_snapshot(h, buf, 8) >= 8
        assert buf.raw[8:] == b"\xee" * 8
    finally:
        client._release()


def test_register_memory_tcp_noop(client):
    assert client.register_memory(bytearray(4096))
    buf = ctypes.create_string_buffer(4096)
    assert client.register_memory(ctypes.addressof(buf), 4096)
    assert client.register_memory(ctypes.addressof(buf), 0) is False   # empty region refused
    with pytest.raises(DfkvError):
        client.register_memory(ctypes.addressof(buf))
    with pytest.raises(DfkvError):
        client.register_memory(bytearray(8), 16)


# -- single-key operations ------------------------------------------------------------------


def test_namespace_and_object_id(client, namespace):
    from dfkv.identity import object_id

    assert client.namespace == namespace
    assert client.object_id(b"k\x00") == object_id(namespace, b"k\x00")


def test_put_get_binary_keys(client):
    keys = [b"\x00", b"a\x00b", b"a\x00c", b"a", b"\xff" * 300, b""]
    vals = [payload(100 + i, i) for i in range(len(keys))]
    for k, v in zip(keys, vals):
        assert client.put(k, v), k
    for k, v in zip(keys, vals):
        assert client.get(k, len(v)) == v, k
        assert client.exist(k)


def test_exact_size_get_vs_get_auto(client):
    v = payload(1000)
    assert client.put(b"k", v)
    assert client.get(b"k", 1000) == v
    assert client.get(b"k", 999) is None          # exact size only
    assert client.get(b"k", 1001) is None
    assert client.get_into(b"k", bytearray(999)) is False
    buf = bytearray(1000)
    assert client.get_into(b"k", buf) and buf == v
    assert client.get_auto(b"k", 1000) == v
    assert client.get_auto(b"k", 4096) == v
    assert client.get_auto(b"k") == v               # default cap
    assert client.get_auto(b"k", 999) is None       # cap too small = miss
    big = bytearray(b"\x55" * 2000)
    assert client.get_auto(b"k", big) == (True, 1000)
    assert big[:1000] == v and big[1000:] == b"\x55" * 1000
    assert client.get_auto(b"k", bytearray(10)) == (False, 0)


def test_scalar_fast_paths_release_and_match_general_path(client):
    # bytes key + bytearray buffer / bytes value take the binding's fast path; the result
    # must equal the general (pinned-buffer) path's, and the export must not outlive the call.
    v = payload(70000, 3)
    assert client.put(b"fast", v)                          # bytes/bytes: fast path
    assert client.put(b"slow", memoryview(v))              # general path
    for key in (b"fast", b"slow", bytearray(b"fast")):   # bytearray key: general path
        buf = bytearray(len(v))
        assert client.get_into(key, buf) and buf == v, key
        buf.extend(b"x")                                   # resizable again: no export left
        assert client.get_into(key, memoryview(bytearray(len(v))))
    assert client.get_into(b"fast", bytearray()) is False  # empty buffer: a miss, no crash
    assert client.put(b"fast", b"") is False               # empty value refused
    assert client.get(b"fast", len(v)) == v                # ...and the old value kept
    with pytest.raises(DfkvError):
        client.get_into(b"fast", bytes(len(v)))            # read-only target still refused


def test_last_error_per_client_and_thread(client, members):
    assert client.get(b"absent", 4) is None
    assert "not found" in client.last_error()
    assert client.put(b"k", b"v")                       # a success keeps the last failure
    assert "not found" in client.last_error()
    assert client.get(b"k", 2) is None
    assert "buffer too small" in client.last_error()
    seen = []
    t = threading.Thread(target=lambda: seen.append(client.last_error()))
    t.start()
    t.join()
    assert seen == [""]                                 # errors are per thread
    with Client(members, b"other") as other:
        assert other.last_error() == ""                 # ...and per client
    client.close()
    assert client.last_error() == ""


def test_miss_is_not_an_exception(client):
    assert client.get(b"nope", 10) is None
    assert client.get_into(b"nope", bytearray(10)) is False
    assert client.get_auto(b"nope", 10) is None
    assert client.get_auto(b"nope", bytearray(10)) == (False, 0)
    assert client.exist(b"nope") is False
    assert "not found" in client.last_error()
    assert client.remove(b"nope") is True               # confirmed absent (original ABI rule)


def test_remove_and_overwrite(client):
    assert client.put(b"k", b"first")
    assert client.put(b"k", b"second value")
    assert client.get(b"k", 5) is None
    assert client.get(b"k", 12) == b"second value"
    assert client.remove(b"k") is True
    assert client.exist(b"k") is False
    assert client.get_auto(b"k", 100) is None
    assert client.remove(b"k") is True                  # already absent: still confirmed gone


def test_zero_length_put_rejected(client):
    assert client.put(b"empty", b"") is False
    assert client.put(b"empty", bytearray()) is False
    assert client.exist(b"empty") is False
    lib = dfkv._lib.load()
    h = client._acquire()
    try:
        assert lib.dfkv_put(h, b"empty", 5, None, 0) == -1
    finally:
        client._release()


def test_namespace_isolation(members):
    with Client(members, namespace=b"ns-a\x00") as a, Client(members, namespace=b"ns-b\x00") as b:
        assert a.put(b"same", b"from-a")
        assert b.put(b"same", b"from-bb")
        assert a.get_auto(b"same", 64) == b"from-a"
        assert b.get_auto(b"same", 64) == b"from-bb"
        assert a.remove(b"same")
        assert b.get_auto(b"same", 64) == b"from-bb"
        b.remove(b"same")
    # Length framing: ("ab", "c") and ("a", "bc") are different objects.
    with Client(members, namespace=b"ab") as x, Client(members, namespace=b"a") as y:
        assert x.put(b"c", b"X")
        assert y.get_auto(b"bc", 8) is None
        x.remove(b"c")


def test_value_buffer_types(client):
    v = payload(3000)
    m = mmap.mmap(-1, len(v))
    m.write(v)
    sources = [v, bytearray(v), memoryview(v), memoryview(bytearray(b"--" + v + b"--"))[2:-2],
               array.array("B", v), m]
    for i, src in enumerate(sources):
        k = b"src%d" % i
        assert client.put(k, src), type(src)
        assert client.get(k, len(v)) == v, type(src)
    m.close()
    with pytest.raises(DfkvError):
        client.put(b"k", "text")
    with pytest.raises(DfkvError):
        client.put("text-key", b"v")
    with pytest.raises(DfkvError):
        client.get_into(b"src0", b"read-only target")
    with pytest.raises(DfkvError):
        client.get_into(b"src0", memoryview(bytearray(6000))[::2])
    with pytest.raises(DfkvError):
        client.get(b"k", -1)


def test_raw_buffer_and_large_value(client):
    v = os.urandom(4 << 20)
    assert client.put(b"big", v)
    dst = ctypes.create_string_buffer(len(v))
    assert client.get_into(b"big", RawBuffer(ctypes.addressof(dst), len(v)))
    assert dst.raw == v


@pytest.mark.skipif(np is None, reason="numpy not importable")
def test_numpy_zero_copy(client):
    pool = np.zeros((4, 1024), dtype=np.float16)          # a host KV pool: one row per page
    src = np.random.default_rng(1).standard_normal((4, 1024)).astype(np.float16)
    assert client.batch_put([b"np%d" % i for i in range(4)], list(src)) == [True] * 4
    assert client.batch_get_into([b"np%d" % i for i in range(4)], list(pool)) == [True] * 4
    assert np.array_equal(pool, src)                       # landed in the pool itself
    row = pool[2]
    assert client.get_into(b"np0", row) and np.array_equal(pool[2], src[0])
    with pytest.raises(DfkvError):
        client.get_into(b"np0", pool[:, ::2])              # non-contiguous
    n = np.int64(src[0].nbytes)                             # sizes from numpy shapes work
    assert client.get(b"np0", n) == src[0].tobytes()
    assert client.get_auto(b"np0", n) == src[0].tobytes()


# -- batches ------------------------------------------------------------------------------------


def test_batch_mixed_hits_and_misses(client):
    keys = [b"b0", b"b1\x00", b"b2", b"b3"]
    vals = [payload(10, 0), payload(20, 1), b"", payload(40, 3)]
    assert client.batch_put(keys, vals) == [True, True, False, True]   # zero-length item fails
    assert client.batch_exist(keys + [b"missing"]) == [True, True, False, True, False]
    bufs = [bytearray(10), bytearray(21), bytearray(5), bytearray(40)]
    assert client.batch_get_into(keys, bufs) == [True, False, False, True]  # b1: wrong size
    assert bufs[0] == vals[0] and bufs[3] == vals[3]
    assert client.batch_get(keys, [10, 20, 1, 40]) == [vals[0], vals[1], None, vals[3]]
    got = client.batch_get_auto(keys, [64, bytearray(64), 64, 39])
    assert got[0] == vals[0]
    assert got[1] == (True, 20)
    assert got[2] is None and got[3] is None                            # miss; cap too small
    assert client.batch_get_auto(keys, 64)[3] == vals[3]
    assert client.batch_remove(keys) == [True] * 4                      # absent counts as removed
    assert client.batch_exist(keys) == [False] * 4


def test_batch_argument_errors(client):
    assert client.batch_put([], []) == []
    assert client.batch_exist([]) == []
    with pytest.raises(DfkvError):
        client.batch_put([b"a", b"b"], [b"1"])
    with pytest.raises(DfkvError):
        client.batch_get_into([b"a"], [b"immutable"])
    with pytest.raises(DfkvError):
        client.batch_exist([b"a", "str-key"])


def test_batch_of_pages(client):
    n, size = 64, 256 << 10
    keys = [b"page-%d" % i for i in range(n)]
    vals = [os.urandom(size) for _ in range(n)]
    assert all(client.batch_put(keys, vals))
    bufs = [bytearray(size) for _ in range(n)]
    assert all(client.batch_get_into(keys, bufs))
    assert bufs == vals


# -- scatter-gather -----------------------------------------------------------------------------


def test_sg_round_trip_uneven_segments(client):
    segs0 = [payload(1, 1), payload(4097, 2), payload(3, 3), payload(70000, 4)]
    segs1 = [payload(5000, 5)]
    whole0, whole1 = b"".join(segs0), b"".join(segs1)
    assert client.batch_put_sg([b"sg0", b"sg1"], [segs0, [bytearray(s) for s in segs1]]) == [True, True]
    # Stored as one value: plain GET sees the concatenation.
    assert client.get(b"sg0", len(whole0)) == whole0
    # Scatter across a different, uneven segmentation with slack at the end.
    outs0 = [bytearray(7), bytearray(33333), bytearray(len(whole0))]
    outs1 = [bytearray(4999), bytearray(1), bytearray(10)]
    res = client.batch_get_auto_sg([b"sg0", b"sg1", b"nope"], [outs0, outs1, [bytearray(8)]])
    assert res == [(True, len(whole0)), (True, len(whole1)), (False, 0)]
    assert bytes(b"".join(outs0))[:len(whole0)] == whole0
    assert bytes(b"".join(outs1))[:len(whole1)] == whole1
    # Total capacity below the stored size is a miss.
    assert client.batch_get_auto_sg([b"sg0"], [[bytearray(10), bytearray(10)]]) == [(False, 0)]


def test_sg_respects_max_segments(client):
    m = client.max_sg_segs
    assert 1 <= m <= 1 << 16
    ok_segs = [payload(8, i) for i in range(m)]
    too_many = [payload(8, i) for i in range(m + 1)]
    assert client.batch_put_sg([b"m0", b"m1", b"m2"], [ok_segs, too_many, []]) == [True, False, False]
    assert client.exist(b"m0") and not client.exist(b"m1") and not client.exist(b"m2")
    res = client.batch_get_auto_sg([b"m0", b"m0"],
                                   [[bytearray(8) for _ in range(m)], [bytearray(8) for _ in range(m + 1)]])
    assert res == [(True, 8 * m), (False, 0)]


@pytest.mark.skipif(np is None, reason="numpy not importable")
def test_sg_numpy_layers(client):
    # A page stored as one object gathered from per-layer slices of a layer-major pool.
    layers, page = 6, 512
    pool = np.random.default_rng(2).integers(0, 255, (layers, 4, page), dtype=np.uint8)
    assert client.batch_put_sg([b"L"], [[pool[layer, 1] for layer in range(layers)]]) == [True]
    dst = np.zeros_like(pool)
    assert client.batch_get_auto_sg([b"L"], [[dst[layer, 3] for layer in range(layers)]]) == [(True, layers * page)]
    assert np.array_equal(dst[:, 3], pool[:, 1])


# -- robustness ---------------------------------------------------------------------------------


def test_threads_share_a_client(client):
    errors = []

    def worker(t):
        try:
            for i in range(30):
                k, v = b"t%d-%d" % (t, i), payload(500 + i, t)
                assert client.put(k, v)
                assert client.get(k, len(v)) == v
        except Exception as e:  # noqa: BLE001 - report any failure from the thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_close_waits_for_calls_in_flight(members, namespace):
    c = Client(members, namespace=namespace)
    stop = time.monotonic() + 1.0
    seen = []

    def worker():
        while time.monotonic() < stop:
            try:
                c.put(b"k", b"v" * 1000)
                c.get(b"k", 1000)
            except DfkvError:
                seen.append("closed")
                return

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    c.close()  # must neither crash nor hang while other threads are inside the library
    for t in threads:
        t.join()
    assert seen.count("closed") == 4


@pytest.mark.parametrize("counter", ["gil", "locked"])
def test_close_returns_only_after_calls_in_flight_end(members, namespace, counter, monkeypatch):
    """close() waits for a call inside the library, whichever in-flight counter is in use:
    the library's dfkv_get is swapped for a Python stand-in that blocks until released, and
    the order of its end and of dfkv_close is recorded."""
    import types

    from dfkv import client as client_mod

    if counter == "locked":
        monkeypatch.setattr(client_mod, "_counter", client_mod._LockedCounter)
    c = Client(members, namespace=namespace)
    real, h = c._lib, c._h
    entered, release, order = threading.Event(), threading.Event(), []

    def blocking_get(*args):
        entered.set()
        assert release.wait(30)
        order.append("get ended")
        return 0

    c._lib = types.SimpleNamespace(dfkv_get=blocking_get, dfkv_close=lambda h: order.append("closed"))
    try:
        caller = threading.Thread(target=c.get_into, args=(b"k", bytearray(8)))
        caller.start()
        assert entered.wait(30)
        closer = threading.Thread(target=c.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive(), "close() returned while a call was inside the library"
        assert order == []
        release.set()
        caller.join(30)
        closer.join(30)
        assert not closer.is_alive()
        assert order == ["get ended", "closed"]
        with pytest.raises(DfkvError, match="closed"):
            c.get_into(b"k", bytearray(8))
        # Calls refused after close() count as started and ended: a second close() is a no-op.
        c.close()
        assert order == ["get ended", "closed"]
    finally:
        release.set()
        real.dfkv_close(h)


def test_dead_node_is_a_fast_miss(lib, namespace):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    with Client(f"n1=127.0.0.1:{port}", namespace=namespace) as c:
        t0 = time.monotonic()
        assert c.put(b"k", b"v") is False
        assert c.get(b"k", 1) is None
        assert c.exist(b"k") is False
        assert c.batch_exist([b"a", b"b"]) == [False, False]
        assert time.monotonic() - t0 < 10


def test_batch_exist_lease_and_max_value_size(client):
    keys = [b"lease-a", b"lease-b", b"lease-missing"]
    assert client.batch_put(keys[:2], [payload(4096, 1), payload(4096, 2)]) == [True, True]
    # the session server is a slab engine: hits are leased (1), the miss is 0
    assert client.batch_exist_lease(keys, 2000) == [1, 1, 0]
    assert client.batch_exist_lease([], 0) == []
    with pytest.raises(DfkvError):
        client.batch_exist_lease(keys, -1)
    # the read consumes the lease; the value is still there
    assert client.get(keys[0], 4096) == payload(4096, 1)
    # the server's default --max-msg is 64 MiB, advertised in HELLO
    assert client.max_value_size == 64 << 20
