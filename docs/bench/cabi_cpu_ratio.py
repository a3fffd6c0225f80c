#!/usr/bin/env python3
"""The C ABI's cost per GET, measured against the server's (BENCHMARKS, "C ABI, part 4").

N threads GET random keys NS-00000000 .. NS-00000383 (1 MiB values, seeded with
python/bench/cabi_compare.py --seed-only --ns NS) through dfkv.Client.get_into, or through the
raw dfkv_get (RAW=1), or through the pure-Python memcached client of cabi_compare (MC=1, ADDR
is memcached's). Over the measured window it prints GB/s, GETs, the client's CPU per GET, the
server's CPU per GET (from /proc/SERVER_PID/stat) and the machine's idle share. The ratio of
the client's CPU to the server's per GET is the steadiest figure on a shared VM: the server does
the same work for every client, so it stands for the machine's speed at that moment.

  DFKV_LIB=build/libdfkv.so python3 docs/bench/cabi_cpu_ratio.py ADDR NS THREADS SECONDS SERVER_PID
"""
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "bench"))

from benchrun import cpu_line, fail, run  # noqa: E402

addr, ns, T, secs, spid = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
N = 1 << 20

if os.environ.get("MC"):
    import cabi_compare

    def new_get():
        return cabi_compare.Memcached(addr, 10).get_into
else:
    import ctypes

    import dfkv

    c = dfkv.Client("n1=" + addr, namespace=ns)

    def new_get():
        if not os.environ.get("RAW"):
            return c.get_into
        buf = (ctypes.c_ubyte * N)()
        raw, h, a = c._lib.dfkv_get, c._h, ctypes.addressof(buf)
        return lambda k, _, keep=buf: raw(h, k, len(k), a, N) == 1  # keep: buf outlives the calls

keys = [b"%s-%08d" % (ns, i) for i in range(384)]


def worker(i, step):
    get, buf, rnd = new_get(), bytearray(N), random.Random(i)

    def one():
        if not get(keys[rnd.randrange(len(keys))], buf):
            fail("a miss: are the keys seeded? (cabi_compare.py --seed-only --ns NS)")

    step(one)


print(cpu_line(run(worker, T, secs, N, server_pid=spid)))
if not os.environ.get("MC"):
    print("\n".join(l for l in c.stats_snapshot().splitlines() if l.startswith("dfkv_cabi_")), file=sys.stderr)
