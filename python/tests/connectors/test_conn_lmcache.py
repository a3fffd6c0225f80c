"""LMCache remote storage plugin against the real LMCache package, libdfkv.so and dfkv_server.

Path taken: real ``lmcache`` (0.5.6, installed with --no-deps by tools/test.sh):
``LMCacheEngineConfig`` with ``remote_storage_plugins=["dfkv"]`` and the
``remote_storage_plugin.dfkv.module_path/.class_name`` extra-config keys, ``LMCacheMetadata``,
``LocalCPUBackend`` (the memory objects), ``CacheEngineKey``, and LMCache's own
``CreateConnector`` / ``ConnectorManager`` plugin loader, which wraps our connector in its
``InstrumentedRemoteConnector``. No LMCache code is copied.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import pytest

pytest.importorskip("torch", reason="torch is not installed (tools/test.sh installs it)")
pytest.importorskip("lmcache.v1.storage_backend.connector",
                    reason="lmcache is not installed (tools/test.sh installs lmcache==0.5.6 --no-deps)")

import torch  # noqa: E402
from engine_support import (  # noqa: E402
    EventSubscriber,
    events_server,
    lmcache_connector,
    lmcache_key,
    run_engine_script,
)

pytestmark = pytest.mark.server


@pytest.fixture
def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def _run(coro_fn):
    """Run coro_fn(loop) on a fresh event loop (LMCache hands connectors its loop)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro_fn(loop))
    finally:
        loop.close()


def _filled(backend, conn, seed: int):
    inner = _inner(conn)
    obj = backend.allocate(inner.meta_shapes, inner.meta_dtypes, inner.meta_fmt)
    g = torch.Generator().manual_seed(seed)
    obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=g).to(obj.tensor.dtype))
    return obj


def _inner(conn):
    # InstrumentedRemoteConnector (LMCache's wrapper) keeps the real one in _connector
    return getattr(conn, "_connector", conn)


def test_plugin_loaded_by_lmcache_connector_manager(members, tenant):
    async def go(loop):
        conn, _ = lmcache_connector(loop, members, tenant)
        inner = _inner(conn)
        from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

        assert type(inner).__name__ == "DfkvRemoteConnector" and isinstance(inner, RemoteConnector)
        assert inner.save_chunk_meta is False
        await conn.close()

    _run(go)


def test_roundtrip_across_processes(members, tenant):
    hashes = [1000 + i for i in range(4)]

    async def put(loop):
        conn, backend = lmcache_connector(loop, members, tenant)
        objs = [_filled(backend, conn, h) for h in hashes]
        digests = [bytes(o.byte_array).hex()[:64] + str(len(o.byte_array)) for o in objs]
        await conn.put(lmcache_key(hashes[0]), objs[0])
        await conn.batched_put([lmcache_key(h) for h in hashes[1:]], objs[1:])
        assert await conn.exists(lmcache_key(hashes[0]))
        assert conn.exists_sync(lmcache_key(hashes[3]))
        full = [bytes(o.byte_array) for o in objs]
        await conn.close()
        return digests, full

    digests, full = _run(put)
    import hashlib

    want = [hashlib.sha256(b).hexdigest() for b in full]
    r = run_engine_script(f"""
        import asyncio, hashlib, json
        from engine_support import lmcache_connector, lmcache_key
        async def go(loop):
            conn, _ = lmcache_connector(loop, {members!r}, {tenant!r})
            keys = [lmcache_key(h) for h in {hashes!r}]
            n = conn.batched_contains(keys + [lmcache_key(1)])
            m = await conn.batched_async_contains("lookup-1", keys, False)
            one = await conn.get(keys[0])
            many = await conn.batched_get(keys[1:])
            objs = [one] + many
            out = {{"contains": n, "async_contains": m,
                    "digests": [hashlib.sha256(bytes(o.byte_array)).hexdigest() for o in objs]}}
            for o in objs:
                o.ref_count_down()
            await conn.close()
            return out
        loop = asyncio.new_event_loop()
        print(json.dumps(loop.run_until_complete(go(loop))))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["contains"] == 4 and out["async_contains"] == 4
    assert out["digests"] == want


def test_blocking_calls_stay_off_the_event_loop(members, tenant):
    async def go(loop):
        conn, backend = lmcache_connector(loop, members, tenant)
        inner = _inner(conn)
        seen = []
        real = inner._exist_many

        def spy(keys):
            seen.append(threading.current_thread().name)
            return real(keys)

        inner._exist_many = spy
        await conn.exists(lmcache_key(5))
        await inner.batched_async_contains("x", [lmcache_key(5)])
        assert seen and all(name.startswith("dfkv-lmcache") for name in seen)
        assert threading.current_thread().name not in seen
        await conn.close()

    _run(go)


def test_close_waits_off_the_event_loop(members, tenant):
    """close() waits for in-flight dfkv calls without blocking the loop: here the in-flight
    call only finishes when another task on the same loop lets it, so a close() that blocked
    the loop would wait out the call's 30 s bound."""
    async def go(loop):
        conn, _ = lmcache_connector(loop, members, tenant)
        inner = _inner(conn)
        release = threading.Event()
        inner._executor.submit(release.wait, 30)  # an in-flight call

        async def other_task():
            await asyncio.sleep(0)
            release.set()

        t0 = time.monotonic()
        task = asyncio.ensure_future(other_task())
        await asyncio.wait_for(conn.close(), 60)
        await task
        assert time.monotonic() - t0 < 10

    _run(go)


def test_missing_short_and_corrupt_values_are_misses(members, tenant):
    import dfkv

    async def go(loop):
        conn, backend = lmcache_connector(loop, members, tenant)
        inner = _inner(conn)
        assert await conn.get(lmcache_key(42)) is None
        with dfkv.Client(members, namespace=inner._client.namespace) as c:
            c.put(inner.object_key(lmcache_key(43)), b"\x01" * 7)  # not a whole token
            c.put(inner.object_key(lmcache_key(44)), b"\x02" * (inner.full_chunk_size_bytes + 64))
            part = inner.single_token_size * 3  # a valid partial chunk (3 tokens)
            c.put(inner.object_key(lmcache_key(45)), b"\x03" * part)
        assert await conn.get(lmcache_key(43)) is None
        assert await conn.get(lmcache_key(44)) is None
        obj = await conn.get(lmcache_key(45))
        assert obj is not None and len(obj.byte_array) == part
        obj.ref_count_down()
        assert conn.remove_sync(lmcache_key(45)) and not conn.exists_sync(lmcache_key(45))
        assert await conn.list() == []
        await conn.close()

    _run(go)


def test_dfkv_url_form(members, tenant):
    host = members.split("=", 1)[1]

    async def go(loop):
        conn, backend = lmcache_connector(loop, "", tenant, url=f"dfkv://n1@{host}")
        obj = _filled(backend, conn, 9)
        await conn.put(lmcache_key(77), obj)
        got = await conn.get(lmcache_key(77))
        assert got is not None and bytes(got.byte_array) == bytes(obj.byte_array)
        await conn.close()

    _run(go)
    from dfkv.connectors.lmcache_remote import parse_dfkv_url

    assert parse_dfkv_url("dfkv://a@h1:1,h2:2?mds=m:9&group=g") == {
        "members": "a=h1:1,h2:2=h2:2", "mds_endpoints": "m:9", "mds_group": "g"}


def test_dfkv_url_through_the_plugin_alone(members, tenant):
    """The nodes as one dfkv:// string in the plugin's own key: one RemoteBackend (no
    remote_url, which would make LMCache build a second one writing the same chunks)."""
    host = members.split("=", 1)[1]

    async def go(loop):
        conn, backend = lmcache_connector(loop, "", tenant, plugin_url=f"dfkv://n1@{host}")
        obj = _filled(backend, conn, 10)
        await conn.put(lmcache_key(78), obj)
        got = await conn.get(lmcache_key(78))
        assert got is not None and bytes(got.byte_array) == bytes(obj.byte_array)
        await conn.close()

    _run(go)


def test_dead_node_is_misses_fast(tenant):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go(loop):
        conn, backend = lmcache_connector(loop, f"n1=127.0.0.1:{port}", tenant)
        t0 = time.monotonic()
        obj = _filled(backend, conn, 1)
        await conn.put(lmcache_key(1), obj)  # dropped, not raised
        await conn.batched_put([lmcache_key(2)], [obj])
        assert await conn.get(lmcache_key(1)) is None
        assert await conn.batched_get([lmcache_key(1), lmcache_key(2)]) == [None, None]
        assert await conn.exists(lmcache_key(1)) is False and conn.exists_sync(lmcache_key(1)) is False
        assert conn.batched_contains([lmcache_key(1)]) == 0
        assert conn.remove_sync(lmcache_key(1)) is False
        assert time.monotonic() - t0 < 15
        await conn.close()

    _run(go)


def test_oversized_chunk_refuses_at_start(small_server, tenant):
    async def go(loop):
        with pytest.raises(ValueError, match=r"one chunk object is \d+ bytes .* --max-msg"):
            lmcache_connector(loop, f"n1={small_server}", tenant)

    _run(go)


@pytest.fixture(scope="module")
def events_node(tmp_path_factory):
    """A dfkv_server publishing KV events: (members, PUB endpoint)."""
    yield from events_server(tmp_path_factory, "dfkv_server_lmcache_events")


def test_stored_chunks_publish_lmcache_chunk_hashes(events_node, tenant):
    """The connector tags every chunk it stores with LMCache's chunk hash (what LMCache's own
    CacheStoreEvent carries), chained by parent, with the key's model: the node's events,
    decoded with vLLM's own classes (how LMCache's events reach routers), name exactly them."""
    pytest.importorskip("vllm.distributed.kv_events", reason="vllm is not installed (tools/test.sh installs it)")
    from vllm.distributed import kv_events

    members, pub = events_node
    base = uuid.uuid4().int & ((1 << 62) - 1)
    hashes = [base + i for i in range(3)]

    async def put(loop):
        conn, backend = lmcache_connector(loop, members, tenant)
        objs = [_filled(backend, conn, i) for i in range(len(hashes))]
        await conn.batched_put([lmcache_key(h) for h in hashes], objs)
        await conn.close()

    with EventSubscriber(pub, kv_events.KVEventBatch) as sub:
        _run(put)
        got = sub.collect(lambda ev: isinstance(ev, kv_events.BlockStored) and set(ev.block_hashes) & set(hashes),
                          lambda got: len(got) >= len(hashes))
    by_hash = {ev.block_hashes[0]: (topic, ev) for topic, ev in got}
    assert sorted(by_hash) == hashes, got
    for i, h in enumerate(hashes):
        topic, ev = by_hash[h]
        assert ev.parent_block_hash == (hashes[i - 1] if i else None), ev
        assert ev.block_size == 16 and topic.endswith("@dfkv-test/tiny-model"), (topic, ev)
