#!/usr/bin/env python3
"""The Go client's CPU per GET against the server's (BENCHMARKS, "C ABI, part 5"): the
in-process baseline of tools/bench compare's dfkv/dfkv_go line, measured the way
cabi_cpu_ratio.py measures the C ABI. It seeds 384 keys of 1 MiB under "gocpu" with dfkv_bench,
then runs dfkv_bench for 3 s per round with THREADS connections. The client's CPU is the
whole dfkv_bench process (rusage; start-up included, so slightly high); the server's is
read from /proc/SERVER_PID/stat over the same window.

  python3 docs/bench/go_cpu_ratio.py ADDR SERVER_PID THREADS ROUNDS [DFKV_BENCH [FLAG ...]]

FLAGs go to dfkv_bench (e.g. --blocking-io: the Go client with blocking socket calls, as the
C ABI's sockets are read).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrun import process_cpu  # noqa: E402

addr, spid, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bench = sys.argv[5] if len(sys.argv) > 5 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "..", "..", "build", "dfkv_bench")

extra = sys.argv[6:]
base = [bench, "--target", "dfkv", "--node", addr, "--op", "get", "--size", "1048576", "--conns", str(threads),
        "--keys", "384", "--ns", "gocpu", "--max-time", "60s", "--strict", "--json"] + extra
subprocess.run(base + ["--duration", "0.5s", "--warmup", "0s", "--seed"], capture_output=True, check=True)
for _ in range(rounds):
    s0 = process_cpu(spid)
    p = subprocess.Popen(base + ["--duration", "3s", "--warmup", "0s"], stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    s1 = process_cpu(spid)
    if status != 0:
        sys.exit("dfkv_bench failed")
    d = json.loads(out.strip().splitlines()[-1])
    ops, client = d["items"], ru.ru_utime + ru.ru_stime
    print("go x%d: %.2f GB/s  %d GETs  client %.1f us/GET  server %.1f us/GET  client/server %.2f"
          % (threads, d["gb_per_s"], ops, client / ops * 1e6, (s1 - s0) / ops * 1e6, client / (s1 - s0)))
