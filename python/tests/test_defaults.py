"""The defaults a Python KV user expects, against the real libdfkv.so and dfkv_server:
``get(key)`` returns the value or None, ``with Client(...)`` closes, ``set`` and ``get(key)``
raise typed ``dfkv.Error`` subclasses mapped from the C ABI's ``dfkv_last_status`` — while
the engine-style forms keep returning False / None (their own tests are in test_client.py)."""

from __future__ import annotations

import socket
import threading
import tracemalloc

import pytest

import dfkv
from dfkv import _abi, errors

pytestmark = pytest.mark.server


def dead_members() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    return f"n1=127.0.0.1:{port}"


def test_get_without_size_returns_value_or_none(client):
    for n in (1, 4096, 3 << 20):
        v = bytes((i * 7 + n) & 0xFF for i in range(n)) if n < 5000 else b"\x5a" * n
        client.set(b"k%d" % n, v)
        got = client.get(b"k%d" % n)
        assert type(got) is bytes and got == v
    assert client.get(b"never-stored") is None


def test_old_exact_size_forms_unchanged(client):
    client.set(b"k", b"12345")
    assert client.get(b"k", 5) == b"12345"
    assert client.get(b"k", 4) is None  # exact size: another length is None, not an error
    buf = bytearray(5)
    assert client.get_into(b"k", buf) is True and bytes(buf) == b"12345"
    assert client.put(b"k2", b"v") is True
    assert client.put(b"empty", b"") is False  # put still returns False instead of raising


def test_with_closes(members, namespace):
    with dfkv.Client(members, namespace=namespace) as c:
        c.set(b"k", b"v")
        assert c.get(b"k") == b"v"
    assert c.closed
    with pytest.raises(dfkv.DfkvError, match="closed"):
        c.get(b"k")


def test_with_closes_on_exception(members, namespace):
    with pytest.raises(KeyError):
        with dfkv.Client(members, namespace=namespace) as c:
            raise KeyError("boom")
    assert c.closed


def test_exception_hierarchy():
    for cls in (dfkv.Unavailable, dfkv.Timeout, dfkv.Forbidden, dfkv.TooLarge, dfkv.BufferTooSmall,
                dfkv.CacheFull, dfkv.QuotaExceeded, dfkv.Busy, dfkv.ServerIOError, dfkv.ProtocolError,
                dfkv.InvalidRequest, dfkv.DfkvError, dfkv.DirectUnsupported):
        assert issubclass(cls, dfkv.Error), cls
        assert cls.__doc__
    assert issubclass(dfkv.Timeout, dfkv.Unavailable)
    assert issubclass(dfkv.InvalidRequest, dfkv.DfkvError)
    assert not issubclass(dfkv.Forbidden, dfkv.Unavailable)
    # each ABI status maps to its own class; unknown and internal codes to the base class
    for name, cls in [("UNAVAILABLE", dfkv.Unavailable), ("TIMEOUT", dfkv.Timeout),
                      ("FORBIDDEN", dfkv.Forbidden), ("TOO_LARGE", dfkv.TooLarge),
                      ("BUFFER_TOO_SMALL", dfkv.BufferTooSmall), ("CACHE_FULL", dfkv.CacheFull),
                      ("QUOTA_EXCEEDED", dfkv.QuotaExceeded), ("BUSY", dfkv.Busy),
                      ("IO_ERROR", dfkv.ServerIOError), ("INVALID", dfkv.InvalidRequest),
                      ("PROTOCOL", dfkv.ProtocolError), ("CLOSED", dfkv.DfkvError),
                      ("DIRECT_UNSUPPORTED", dfkv.DirectUnsupported)]:
        e = errors.error_for_status(getattr(_abi, "STATUS_" + name), "why")
        assert type(e) is cls and e.status == getattr(_abi, "STATUS_" + name) and str(e) == "why"
    for code in (_abi.STATUS_INTERNAL, 999):
        assert type(errors.error_for_status(code, "")) is dfkv.Error


def test_set_too_large_for_the_node(small_server, namespace):
    # small_server runs with --max-msg 300 and advertises it in HELLO
    with dfkv.Client(f"n1={small_server}", namespace=namespace) as c:
        with pytest.raises(dfkv.TooLarge, match="max value") as ei:
            c.set(b"big", bytes(301))  # the first call: the limit is learned on connect
        assert ei.value.status == _abi.STATUS_TOO_LARGE
        c.set(b"fits", bytes(300))
        assert c.get(b"fits") == bytes(300)
        assert c.put(b"big", bytes(301)) is False  # the engine-style form still does not raise


def test_set_too_large_for_the_client(client):
    with pytest.raises(dfkv.TooLarge):
        client.set(b"huge", bytes(dfkv.MAX_VALUE_SIZE + 1))


def test_set_empty_is_invalid(client):
    with pytest.raises(dfkv.InvalidRequest) as ei:
        client.set(b"k", b"")
    assert isinstance(ei.value, dfkv.DfkvError)  # old `except DfkvError` code still catches it


def test_dead_node_raises_unavailable(lib, namespace):
    with dfkv.Client(dead_members(), namespace=namespace) as c:
        with pytest.raises(dfkv.Unavailable) as ei:
            c.get(b"k")
        assert ei.value.status in (_abi.STATUS_UNAVAILABLE, _abi.STATUS_TIMEOUT)
        with pytest.raises(dfkv.Unavailable):
            c.set(b"k", b"v")
        # the engine-style forms: a failure is a miss, as before
        assert c.get(b"k", 1) is None
        assert c.put(b"k", b"v") is False


def test_value_longer_than_get_reads_is_buffer_too_small(client, monkeypatch):
    """get(key) reads at most MAX_VALUE_SIZE bytes; a longer stored value raises
    BufferTooSmall (a TooLarge) rather than returning None, which would read as a miss. The
    library stores at most 64 MiB = MAX_VALUE_SIZE, so the cap is lowered to see it."""
    import dfkv.client as dc

    client.set(b"long", bytes(200))
    monkeypatch.setattr(dc, "MAX_VALUE_SIZE", 100)
    with pytest.raises(dfkv.BufferTooSmall) as ei:
        client.get(b"long")
    assert isinstance(ei.value, dfkv.TooLarge) and ei.value.status == _abi.STATUS_BUFFER_TOO_SMALL
    assert client.get(b"absent") is None  # a miss is still None under the lower cap
    monkeypatch.setattr(dc, "MAX_VALUE_SIZE", 200)
    assert client.get(b"long") == bytes(200)  # exactly the cap: read whole


def test_get_without_size_reuses_one_buffer_per_thread(client, monkeypatch):
    """get(key) reads through a per-thread buffer of the client, grown to the next power of
    two when a value is longer and kept up to _GET_BUF_KEEP; longer values read into their
    own buffer. Every read returns the exact bytes, whichever route it took."""
    import dfkv.client as dc

    small, mid = b"s" * 100, bytes(range(256)) * (3 << 12)  # 100 B; 3 MiB
    client.set(b"small", small)
    client.set(b"mid", mid)
    assert client.get(b"small") == small
    buf = client._getbuf.buf
    assert len(buf) == dc._GET_BUF_MIN
    for _ in range(50):
        assert client.get(b"small") == small
    assert client._getbuf.buf is buf  # reused, not reallocated
    assert client.get(b"mid") == mid  # too long for it: read once with room for any value
    grown = client._getbuf.buf
    assert len(grown) == 4 << 20 and client._getbuf.big is False
    assert client.get(b"mid") == mid and client.get(b"small") == small
    assert client._getbuf.buf is grown  # kept for the next long value
    assert client.get_auto(b"mid") == mid and client.get_auto(b"absent") is None

    monkeypatch.setattr(dc, "_GET_BUF_KEEP", 1 << 20)  # mid is now over what a thread keeps
    client._getbuf.__dict__.clear()  # this thread starts over with a fresh buffer
    assert client.get(b"mid") == mid
    assert client._getbuf.big is True and len(client._getbuf.buf) == dc._GET_BUF_MIN
    assert client.get(b"mid") == mid  # straight to the large read, no refused first try
    assert client.get(b"small") == small and client._getbuf.big is False

    seen = {}

    def in_thread():
        seen["v"] = client.get(b"small")
        seen["buf"] = client._getbuf.buf

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(30)
    assert seen["v"] == small and seen["buf"] is not client._getbuf.buf  # one buffer per thread


def test_get_without_size_allocates_about_the_value(client):
    """No call reserves MAX_VALUE_SIZE (64 MiB) any more: the memory Python allocates during
    get(key) is the returned value (and, once, the thread's buffer), measured by tracemalloc
    (bytes and ctypes buffers come from the Python allocator it traces)."""
    value = b"\x33" * (1 << 20)
    client.set(b"one-mib", value)
    client.set(b"tiny", b"t")
    assert client.get(b"one-mib") == value  # warm: the thread's buffer has grown to 1 MiB
    tracemalloc.start()
    try:
        for _ in range(20):
            assert client.get(b"tiny") == b"t"
        tiny_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        for _ in range(20):
            assert len(client.get(b"one-mib")) == len(value)
        mib_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tiny_peak < 256 << 10, tiny_peak
    assert mib_peak < 3 << 20, mib_peak  # one value alive at a time, plus the next one


def test_status_is_per_thread_and_resets_on_success(client, lib):
    """dfkv_last_status reports the calling thread's last failure on the handle, like
    dfkv_last_error; a miss is STATUS_NOT_FOUND."""
    h = client._h
    assert client.get(b"absent-key", 3) is None
    assert lib.dfkv_last_status(h) == _abi.STATUS_NOT_FOUND
    assert client.put(b"e", b"") is False
    assert lib.dfkv_last_status(h) == _abi.STATUS_INVALID
    assert lib.dfkv_last_status(None) in range(0, 15)  # never crashes on NULL
