"""The library's tracking of its C caller threads, through the real libdfkv.so: every thread
that makes a data call is counted until it exits, Go gets one P more than there are such
threads (unless GOMAXPROCS is set in the environment), and a thread that calls steadily
yields now and then so that sysmon never has to take its P back (dfkv_abi.c;
docs/BENCHMARKS.md, "C ABI, part 4")."""

from __future__ import annotations

import os
import threading
import time

import pytest

from conftest import run_python

pytestmark = pytest.mark.server


def cabi_stats(client) -> dict:
    out = {}
    for line in client.stats_snapshot().splitlines():
        if line.startswith("dfkv_cabi_"):
            name, value = line.split()
            out[name] = int(value)
    return out


def wait_for(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.01)


def test_caller_threads_counted_and_procs_raised(client):
    base = cabi_stats(client)["dfkv_cabi_caller_threads"]
    n = 6
    called = threading.Barrier(n + 1)
    release = threading.Event()
    errors = []

    def caller():
        try:
            assert client.get_into(b"absent-key", bytearray(16)) is False  # a data call: counted
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        called.wait(timeout=30)
        release.wait(timeout=30)

    ts = [threading.Thread(target=caller) for _ in range(n)]
    for t in ts:
        t.start()
    called.wait(timeout=30)
    try:
        during = cabi_stats(client)
    finally:
        release.set()
        for t in ts:
            t.join(timeout=30)
    assert not errors
    assert during["dfkv_cabi_caller_threads"] == base + n
    if os.environ.get("GOMAXPROCS"):
        assert during["dfkv_cabi_gomaxprocs"] == int(os.environ["GOMAXPROCS"])
    else:
        assert during["dfkv_cabi_gomaxprocs"] >= base + n + 1
    # Python's join returns before the OS thread has run its exit destructors.
    wait_for(lambda: cabi_stats(client)["dfkv_cabi_caller_threads"] == base, "the exited threads to be uncounted")
    # GOMAXPROCS is never lowered again.
    assert cabi_stats(client)["dfkv_cabi_gomaxprocs"] >= during["dfkv_cabi_gomaxprocs"]


def test_busy_caller_yields_idle_caller_does_not(client):
    client.put(b"k", b"v" * 64)
    buf = bytearray(64)
    before = cabi_stats(client)["dfkv_cabi_yields_total"]
    # Steady calls (each far under the 4 ms gap) for 0.2 s: a yield about every 6 ms.
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        assert client.get_into(b"k", buf)
    busy = cabi_stats(client)["dfkv_cabi_yields_total"] - before
    assert busy >= 5, busy
    # Calls 20 ms apart are an occasional caller's: no yields.
    before = cabi_stats(client)["dfkv_cabi_yields_total"]
    for _ in range(5):
        time.sleep(0.02)
        assert client.get_into(b"k", buf)
    assert cabi_stats(client)["dfkv_cabi_yields_total"] == before


def test_gomaxprocs_from_the_environment_is_kept(members):
    code = f"""
import threading, dfkv
c = dfkv.Client({members!r}, namespace=b"procs")
ts = [threading.Thread(target=lambda: c.get_into(b"absent", bytearray(8))) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print([l for l in c.stats_snapshot().splitlines() if l.startswith("dfkv_cabi_gomaxprocs")][0])
c.close()
"""
    r = run_python(code, env={"GOMAXPROCS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["dfkv_cabi_gomaxprocs", "1"]
    r = run_python(code, env={"GOMAXPROCS": ""})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[1]) >= 5  # four caller threads + 1
