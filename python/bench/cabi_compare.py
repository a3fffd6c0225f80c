#!/usr/bin/env python3
"""The engine's view of dfkv: libdfkv through ctypes from N Python threads, against a plain
pure-Python memcached client (blocking socket, ``readinto`` a preallocated buffer) doing the
same work from the same number of threads.

One invocation is one measurement of one system; ``tools/bench compare`` interleaves them and
prints the ``cabi:`` ratios. Each thread owns its buffers (allocated once) and picks random
keys out of the same working set (--keys values of --size bytes) on both systems; every value
carries its key index in its first 8 bytes and every hit is checked against it, so a run that
returns wrong bytes fails instead of looking fast.

  cabi_compare.py --system dfkv --addr HOST:PORT --op get --mode scalar --threads 4 ...
  cabi_compare.py --system memcached_py --addr HOST:PORT ...

--mode scalar: one key per call (dfkv_get / dfkv_put; memcached get / set).
--mode sg: calls of --batch keys, each value scattered over --segs segments
(dfkv_batch_get_auto_sg / dfkv_batch_put_sg; memcached: one multi-key "get" read segment
by segment with readinto, pipelined "set"s gathered with sendmsg).

Prints one JSON line: {"system", "op", "mode", "threads", "size", "gb_per_s", "ops_per_s",
"p50_us", "p99_us", "items", "client_cpu_s_per_gb"}. Exit status 1 when any call failed or returned wrong bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import struct
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def key_of(prefix: bytes, i: int) -> bytes:
    return b"%s-%08d" % (prefix, i)


def make_value(size: int, i: int) -> bytearray:
    v = bytearray(os.urandom(min(size, 4096)) * ((size + 4095) // 4096))[:size]
    v[:8] = struct.pack("<Q", i)[: min(8, size)]
    return v


def stamp_ok(buf, i: int) -> bool:
    n = min(8, len(buf))
    return bytes(buf[:n]) == struct.pack("<Q", i)[:n]


# --------------------------------------------------------------------------------------
# The pure-Python memcached client: the reference an engine author would write in 20 lines.


class Memcached:
    def __init__(self, addr: str, timeout: float):
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.r = self.s.makefile("rb", buffering=64 << 10)
        self.tail = bytearray(7)  # "\r\nEND\r\n" after a single value

    def close(self) -> None:
        self.r.close()
        self.s.close()

    def _readinto(self, mv) -> None:
        while len(mv):
            n = self.r.readinto(mv)
            if not n:
                raise ConnectionError("memcached closed the connection")
            mv = mv[n:]

    def _value_header(self, key: bytes) -> int:
        line = self.r.readline()
        if line == b"END\r\n":
            return -1
        parts = line.split()
        if len(parts) < 4 or parts[0] != b"VALUE" or parts[1] != key:
            raise ConnectionError("memcached: unexpected reply %r" % line[:80])
        return int(parts[3])

    def get_into(self, key: bytes, buf) -> bool:
        self.s.sendall(b"get " + key + b"\r\n")
        n = self._value_header(key)
        if n < 0:
            return False
        if n != len(buf):
            raise ConnectionError("memcached: %d-byte value for a %d-byte buffer" % (n, len(buf)))
        self._readinto(memoryview(buf))
        self._readinto(memoryview(self.tail))
        return True

    def multi_get_sg(self, keys, seg_lists) -> list:
        self.s.sendall(b"get " + b" ".join(keys) + b"\r\n")
        hits = [False] * len(keys)
        for i, k in enumerate(keys):  # memcached answers hits in request order
            n = self._value_header(k)
            if n < 0:
                return hits
            if n != sum(len(s) for s in seg_lists[i]):
                raise ConnectionError("memcached: %d-byte value does not fit the segments" % n)
            for seg in seg_lists[i]:
                self._readinto(memoryview(seg))
            self._readinto(memoryview(self.tail)[:2])
            hits[i] = True
        if self.r.readline() != b"END\r\n":
            raise ConnectionError("memcached: multi-get without END")
        return hits

    def _sendmsg_all(self, views) -> None:
        """Gathered send of every view (sendmsg; a short send resumes where it stopped)."""
        while views:
            n = self.s.sendmsg(views[:512])  # IOV_MAX is 1024
            while n:
                if n >= len(views[0]):
                    n -= len(views[0])
                    views = views[1:]
                else:
                    views[0] = views[0][n:]
                    n = 0

    def set_many(self, keys, seg_lists) -> None:
        parts = []
        for k, segs in zip(keys, seg_lists):
            parts.append(b"set %s 0 0 %d\r\n" % (k, sum(len(s) for s in segs)))
            parts.extend(segs)
            parts.append(b"\r\n")
        self._sendmsg_all([memoryview(p).cast("B") for p in parts])
        for _ in keys:
            if self.r.readline() != b"STORED\r\n":
                raise ConnectionError("memcached: set not STORED")


# --------------------------------------------------------------------------------------


def proc_cpu(pid):
    """CPU seconds (user + system) a process has used so far, or None."""
    if not pid:
        return None
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, choices=["dfkv", "memcached_py"])
    ap.add_argument("--addr", required=True)
    ap.add_argument("--op", default="get", choices=["get", "put"])
    ap.add_argument("--mode", default="scalar", choices=["scalar", "sg"])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--segs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--seed", action="store_true", help="store every key first, then read each back once")
    ap.add_argument("--seed-only", action="store_true", help="--seed, then exit without measuring")
    ap.add_argument("--ns", default="cabi")
    ap.add_argument("--server-pid", type=int, default=0, help="report this server's CPU per GB too")
    ap.add_argument("--timeout", type=float, default=10.0, help="socket timeout (memcached_py)")
    a = ap.parse_args()
    if not (1 <= a.threads <= 256 and a.size > 0 and a.keys > 0 and 1 <= a.batch <= a.keys and a.segs >= 1):
        ap.error("bad --threads/--size/--keys/--batch/--segs")
    if a.mode == "sg" and a.size % a.segs:
        ap.error("--size must be a multiple of --segs")
    prefix = a.ns.encode()

    dc = None
    if a.system == "dfkv":
        import dfkv

        dc = dfkv.Client(f"n1={a.addr}", namespace=prefix)

    def new_conn():
        return Memcached(a.addr, a.timeout) if a.system == "memcached_py" else None

    if a.seed or a.seed_only:
        vals = [make_value(a.size, i) for i in range(min(a.keys, 64))]
        mc = new_conn()
        step = 16
        for lo in range(0, a.keys, step):
            ks = [key_of(prefix, i) for i in range(lo, min(a.keys, lo + step))]
            vs = []
            for i in range(lo, min(a.keys, lo + step)):
                v = vals[i % len(vals)]
                v[:8] = struct.pack("<Q", i)[: min(8, a.size)]
                vs.append(bytes(v))
            if dc is not None:
                if not all(dc.batch_put(ks, vs)):
                    print("seeding dfkv failed", file=sys.stderr)
                    return 1
            else:
                mc.set_many(ks, [[v] for v in vs])
        # Read every key back once: checks the seed, and a value the server stored without
        # keeping it in RAM (dfkv's tier declines to publish a value whose stripe saw an
        # overlapping write) is promoted now rather than during the measurement.
        buf = bytearray(a.size)
        for i in range(a.keys):
            ok = mc.get_into(key_of(prefix, i), buf) if mc else dc.get_into(key_of(prefix, i), buf)
            if not ok or not stamp_ok(buf, i):
                print("seed read-back of key %d failed" % i, file=sys.stderr)
                return 1
        if mc:
            mc.close()
        if a.seed_only:
            if dc is not None:
                dc.close()
            print(json.dumps({"system": a.system, "seeded": a.keys, "size": a.size}), flush=True)
            return 0

    phase = [0]  # 0 warm-up, 1 measuring, 2 stop
    stats = []
    errors = []
    start_barrier = threading.Barrier(a.threads + 1)
    seg = a.size // a.segs

    def worker(tid: int) -> None:
        rng = random.Random(tid * 7919 + 1)
        n = 1 if a.mode == "scalar" else a.batch
        bufs = [bytearray(a.size) for _ in range(n)]
        segs = [[memoryview(b)[j * seg:(j + 1) * seg] for j in range(a.segs)] for b in bufs]
        vals = [make_value(a.size, 0) for _ in range(n)]
        vsegs = [[memoryview(v)[j * seg:(j + 1) * seg] for j in range(a.segs)] for v in vals]
        lat, items, byts = [], 0, 0
        mc = None
        try:
            mc = new_conn()
            start_barrier.wait()
            while phase[0] != 2:
                idx = rng.sample(range(a.keys), n) if n > 1 else [rng.randrange(a.keys)]
                keys = [key_of(prefix, i) for i in idx]
                if a.op == "put":
                    for v, i in zip(vals, idx):
                        v[:8] = struct.pack("<Q", i)[: min(8, a.size)]
                t0 = time.perf_counter()
                if a.op == "get":
                    if a.mode == "scalar":
                        ok = [mc.get_into(keys[0], bufs[0]) if mc else dc.get_into(keys[0], bufs[0])]
                    elif mc:
                        ok = mc.multi_get_sg(keys, segs)
                    else:
                        ok = [h and ln == a.size for h, ln in dc.batch_get_auto_sg(keys, segs)]
                else:
                    if a.mode == "scalar":
                        if mc:
                            mc.set_many(keys, [vals])
                            ok = [True]
                        else:
                            ok = [dc.put(keys[0], vals[0])]
                    elif mc:
                        mc.set_many(keys, vsegs)
                        ok = [True] * n
                    else:
                        ok = dc.batch_put_sg(keys, vsegs)
                dt = time.perf_counter() - t0
                if not all(ok):
                    raise RuntimeError("%s %s failed or missed (%d of %d ok)" % (a.system, a.op, sum(ok), n))
                if a.op == "get":
                    for b, i in zip(bufs, idx):
                        if not stamp_ok(b, i):
                            raise RuntimeError("%s returned wrong bytes for key %d" % (a.system, i))
                if phase[0] == 1:
                    lat.append(dt)
                    items += n
                    byts += n * a.size
        except Exception as e:  # noqa: BLE001 - reported and failing the run
            errors.append("thread %d: %s" % (tid, e))
            phase[0] = 2
            try:
                start_barrier.abort()
            except threading.BrokenBarrierError:
                pass
        finally:
            if mc:
                mc.close()
            stats.append((lat, items, byts))

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.threads)]
    for t in ts:
        t.start()
    try:
        start_barrier.wait(timeout=30)
    except threading.BrokenBarrierError:
        pass
    time.sleep(a.warmup)
    if phase[0] == 0:
        phase[0] = 1
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    srv0 = proc_cpu(a.server_pid)
    t0 = time.perf_counter()
    end = t0 + a.seconds
    while phase[0] == 1 and time.perf_counter() < end:
        time.sleep(0.02)
    el = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    srv1 = proc_cpu(a.server_pid)
    phase[0] = 2
    for t in ts:
        t.join(timeout=a.timeout + 30)
    if dc is not None:
        dc.close()
    if errors or any(t.is_alive() for t in ts):
        for e in errors:
            print("cabi_compare: " + e, file=sys.stderr)
        if any(t.is_alive() for t in ts):
            print("cabi_compare: a thread did not finish", file=sys.stderr)
        return 1
    lat = [x for s in stats for x in s[0]]
    items = sum(s[1] for s in stats)
    byts = sum(s[2] for s in stats)
    print(json.dumps({
        "system": a.system, "op": a.op, "mode": a.mode, "threads": a.threads, "size": a.size,
        "batch": 1 if a.mode == "scalar" else a.batch, "keys": a.keys, "seconds": round(el, 3),
        "gb_per_s": byts / el / 1e9, "ops_per_s": len(lat) / el, "items": items,
        "p50_us": percentile(lat, 0.5) * 1e6 if lat else None,
        "p99_us": percentile(lat, 0.99) * 1e6 if lat else None,
        # Client-process CPU per GB moved: a figure the shared machine's noise moves less.
        "client_cpu_s_per_gb": ((ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                                / max(byts / 1e9, 1e-9)) if byts else None,
        "server_cpu_s_per_gb": ((srv1 - srv0) / max(byts / 1e9, 1e-9)) if byts and srv0 is not None
        and srv1 is not None else None,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
