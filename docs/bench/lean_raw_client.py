#!/usr/bin/env python3
"""Python threads doing 1 MiB GETs over dfkv_bench rawserver's 16-byte protocol (slots
0..383), recv_into a preallocated buffer. Prints GB/s.

  python3 docs/bench/lean_raw_client.py HOST:PORT THREADS SECONDS
"""
import random, socket, struct, sys, threading, time

host, port = sys.argv[1].rsplit(":", 1)
T, secs = int(sys.argv[2]), float(sys.argv[3])
N = 1 << 20
counts = [0] * T
start_at = time.time() + 0.3
stop = start_at + secs


def worker(i):
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mv = memoryview(bytearray(N + 16))
    rnd = random.Random(i)
    n = 0
    while True:
        now = time.time()
        if now > stop:
            break
        s.sendall(struct.pack("<IQI", 2, N, rnd.randrange(384)))
        got = 0
        while got < N + 16:
            r = s.recv_into(mv[got:], N + 16 - got)
            if r == 0:
                raise SystemExit("eof")
            got += r
        if now >= start_at:
            n += 1
    counts[i] = n


ts = [threading.Thread(target=worker, args=(i,)) for i in range(T)]
[t.start() for t in ts]
[t.join() for t in ts]
print("%.2f" % (sum(counts) * N / secs / 1e9))
