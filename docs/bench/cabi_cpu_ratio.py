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
import resource
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "bench"))

addr, ns, T, secs, spid = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
N = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def machine_idle():
    f = open("/proc/stat").readline().split()[1:]
    return int(f[3]) + int(f[4])


def server_cpu():
    f = open("/proc/%s/stat" % spid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


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
counts = [0] * T
start_at = time.time() + 0.4
stop = start_at + secs


def worker(i):
    get, buf, rnd, n = new_get(), bytearray(N), random.Random(i), 0
    while True:
        now = time.time()
        if now > stop:
            break
        if not get(keys[rnd.randrange(len(keys))], buf):
            os._exit(3)  # a miss: not seeded
        if now >= start_at:
            n += 1
    counts[i] = n


ts = [threading.Thread(target=worker, args=(i,)) for i in range(T)]
for t in ts:
    t.start()
time.sleep(max(0, start_at - time.time()))
r0, s0, m0 = resource.getrusage(resource.RUSAGE_SELF), server_cpu(), machine_idle()
time.sleep(max(0, stop - time.time()))
r1, s1, m1 = resource.getrusage(resource.RUSAGE_SELF), server_cpu(), machine_idle()
for t in ts:
    t.join()
n = max(1, sum(counts))
cli = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e6
srv = (s1 - s0) / n * 1e6
print("%.2f GB/s  %d GETs  client %.1f us/GET  server %.1f us/GET  client/server %.2f  idle %.1f%%" % (
    n * N / secs / 1e9, n, cli, srv, cli / srv if srv else 0, (m1 - m0) / TICK / (os.cpu_count() * secs) * 100))
if not os.environ.get("MC"):
    print("\n".join(l for l in c.stats_snapshot().splitlines() if l.startswith("dfkv_cabi_")), file=sys.stderr)
