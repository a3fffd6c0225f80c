#!/usr/bin/env python3
"""A 25-line pure-Python dfkv GET client: replays the requests capture_requests.py recorded
(hello, then GET prefixes of random keys) from THREADS threads for SECONDS, reading each
32-byte reply header and the payload with recv_into into a preallocated buffer. Prints GB/s.

  python3 docs/bench/lean_dfkv_client.py reqs.pkl HOST:PORT THREADS SECONDS [plain|waitall|buf4m]

waitall: the payload read with MSG_WAITALL; buf4m: 4 MiB SO_RCVBUF/SO_SNDBUF like libdfkv's.
"""
import pickle, random, socket, struct, sys

from benchrun import fail, readinto, run

hello, reqs = pickle.load(open(sys.argv[1], "rb"))
host, port = sys.argv[2].rsplit(":", 1)
T, secs = int(sys.argv[3]), float(sys.argv[4])
MODE = sys.argv[5] if len(sys.argv) > 5 else "plain"
N = 1 << 20


def worker(i, step):
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if MODE == "buf4m":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    hdr = bytearray(32)
    hv = memoryview(hdr)
    s.sendall(hello)
    readinto(s, hv)
    readinto(s, memoryview(bytearray(struct.unpack_from("<Q", hdr, 24)[0])))
    mv = memoryview(bytearray(N))
    rnd = random.Random(i)

    def get():
        s.sendall(reqs[rnd.randrange(len(reqs))])
        readinto(s, hv)
        if hdr[5] != 0:
            fail("status %d: are the keys stored? (capture_requests.py)" % hdr[5])
        readinto(s, mv[:struct.unpack_from("<Q", hdr, 24)[0]], socket.MSG_WAITALL if MODE == "waitall" else 0)

    step(get)


print("%.2f" % run(worker, T, secs, N, lead=0.5)["gb_per_s"])
