#!/usr/bin/env python3
"""Python threads doing 1 MiB GETs over dfkv_bench rawserver's 16-byte protocol (slots
0..383), recv_into a preallocated buffer. Prints GB/s.

  python3 docs/bench/lean_raw_client.py HOST:PORT THREADS SECONDS
"""
import random, socket, struct, sys

from benchrun import readinto, run

host, port = sys.argv[1].rsplit(":", 1)
T, secs = int(sys.argv[2]), float(sys.argv[3])
N = 1 << 20


def worker(i, step):
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mv = memoryview(bytearray(N + 16))
    rnd = random.Random(i)

    def get():
        s.sendall(struct.pack("<IQI", 2, N, rnd.randrange(384)))
        readinto(s, mv)

    step(get)


print("%.2f" % run(worker, T, secs, N, lead=0.3)["gb_per_s"])
