"""The library's tracking of its C caller threads, through the real libdfkv.so: every thread
that makes a data call into Go is counted until it exits (dfkv_get and dfkv_get_auto, served
in C by the fast path, do not enter Go, so these tests call dfkv_exist), and a thread that
calls steadily yields now and then, while there are fewer caller threads than Go Ps, so
that sysmon never has to take its P back (dfkv_abi.c; docs/BENCHMARKS.md, "C ABI, part 4"). Each test runs in a fresh
interpreter, so that no thread of another test can come or go while it counts."""

from __future__ import annotations

import pytest

from conftest import run_python

pytestmark = pytest.mark.server

PRELUDE = """
import threading, time, dfkv
c = dfkv.Client({members!r}, namespace=b"callers")
def stats():
    return dict((l.split()[0], int(l.split()[1])) for l in c.stats_snapshot().splitlines()
                if l.startswith("dfkv_cabi_"))
"""


def run(members: str, body: str, gomaxprocs: str) -> list:
    r = run_python(PRELUDE.format(members=members) + body + "\nc.close()\n", env={"GOMAXPROCS": gomaxprocs})
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.split()]


COUNT = """
n = 6
called, release = threading.Barrier(n + 1), threading.Event()
def caller():
    assert c.exist(b"absent-key") is False  # a data call into Go: counted
    called.wait(timeout=30)
    release.wait(timeout=30)
before = stats()
ts = [threading.Thread(target=caller) for _ in range(n)]
[t.start() for t in ts]
called.wait(timeout=30)
during = stats()
release.set()
[t.join(timeout=30) for t in ts]
# Python's join returns before the OS thread has run its exit destructors.
deadline = time.monotonic() + 10
while stats()["dfkv_cabi_caller_threads"] != 0 and time.monotonic() < deadline:
    time.sleep(0.01)
after = stats()
print(before["dfkv_cabi_caller_threads"], during["dfkv_cabi_caller_threads"], after["dfkv_cabi_caller_threads"],
      before["dfkv_cabi_gomaxprocs"], after["dfkv_cabi_gomaxprocs"])
"""


def test_caller_threads_counted_until_they_exit(members):
    threads_before, threads_during, threads_after, procs_before, procs_after = run(members, COUNT, "3")
    assert (threads_before, threads_during, threads_after) == (0, 6, 0)
    assert procs_before == procs_after == 3  # the library never changes GOMAXPROCS


BUSY = """
c.put(b"k", b"v" * 64)
before = stats()["dfkv_cabi_yields_total"]
# Steady calls (each far under the 4 ms gap) for 0.2 s: a yield about every 6 ms.
end = time.monotonic() + 0.2
while time.monotonic() < end:
    assert c.exist(b"k")
busy = stats()["dfkv_cabi_yields_total"] - before
# Calls 20 ms apart are an occasional caller's: no yields.
before = stats()["dfkv_cabi_yields_total"]
for _ in range(5):
    time.sleep(0.02)
    assert c.exist(b"k")
print(busy, stats()["dfkv_cabi_yields_total"] - before)
"""


def test_busy_caller_yields_occasional_caller_does_not(members):
    busy, occasional = run(members, BUSY, "4")  # one caller thread, four Ps
    assert busy >= 5, busy
    assert occasional == 0


def test_no_yields_without_a_spare_p(members):
    # One caller thread and one P: sysmon takes the P back anyway, so a yield would only
    # cost its wake-ups.
    busy, occasional = run(members, BUSY, "1")
    assert (busy, occasional) == (0, 0)
