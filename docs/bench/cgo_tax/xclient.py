#!/usr/bin/env python3
"""The lean dfkv-wire client (lean_dfkv_client.py), each GET through one function of the
stand-in library (README.md): XF = dfkvx_get (default) | cx_get | cx_get_y | cx_get_nogo.
Prints the same line as cabi_cpu_ratio.py.

  XF=cx_get python3 docs/bench/cgo_tax/xclient.py reqs.pkl HOST:PORT THREADS SECONDS SERVER_PID /tmp/x/libx.so
"""
import ctypes, os, pickle, random, socket, struct, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchrun import cpu_line, fail, readinto, run  # noqa: E402

hello, reqs = pickle.load(open(sys.argv[1], "rb"))
host, port = sys.argv[2].rsplit(":", 1)
T, secs, spid = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
get_fn = getattr(ctypes.CDLL(sys.argv[6]), os.environ.get("XF", "dfkvx_get"))
get_fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong]
get_fn.restype = ctypes.c_int
N = 1 << 20


def worker(i, step):
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    hdr = bytearray(32)
    s.sendall(hello)
    readinto(s, memoryview(hdr))
    readinto(s, memoryview(bytearray(struct.unpack_from("<Q", hdr, 24)[0])))
    fd, buf, rnd = s.fileno(), (ctypes.c_ubyte * N)(), random.Random(i)
    a = ctypes.addressof(buf)

    def get():
        q = reqs[rnd.randrange(len(reqs))]
        if get_fn(fd, q, len(q), a, N) != 1:
            fail("GET failed or missed: are the keys stored? (capture_requests.py)")

    step(get)


print(cpu_line(run(worker, T, secs, N, server_pid=spid)))
