# xclient.py REQS ADDR THREADS SECONDS SERVER_PID LIBX: the lean dfkv-wire client, each GET through the stand-in library (function XF, default dfkvx_get); prints GB/s, GETs, client and server CPU per GET, machine idle
import ctypes, os, pickle, resource, socket, struct, sys, threading, time, random
hello, reqs = pickle.load(open(sys.argv[1], "rb"))
host, port = sys.argv[2].rsplit(":", 1); T, secs, spid = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
lib = ctypes.CDLL(sys.argv[6]); g = getattr(lib, os.environ.get("XF", "dfkvx_get"))
g.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong]; g.restype = ctypes.c_int
def mstat():
    f = open("/proc/stat").readline().split()[1:]; return int(f[3]) + int(f[4])
def scpu():
    f = open("/proc/%s/stat" % spid).read().rsplit(")", 1)[1].split(); return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
N = 1 << 20; counts = [0] * T; start_at = time.time() + 0.4; stop = start_at + secs
def readinto(s, mv):
    while len(mv):
        r = s.recv_into(mv)
        if r == 0: raise SystemExit("eof")
        mv = mv[r:]
def worker(i):
    s = socket.create_connection((host, int(port))); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    hdr = bytearray(32); hv = memoryview(hdr)
    s.sendall(hello); readinto(s, hv); readinto(s, memoryview(bytearray(struct.unpack_from("<Q", hdr, 24)[0])))
    fd = s.fileno(); buf = (ctypes.c_ubyte * N)(); a = ctypes.addressof(buf); rnd = random.Random(i); n = 0
    while True:
        now = time.time()
        if now > stop: break
        q = reqs[rnd.randrange(len(reqs))]
        if g(fd, q, len(q), a, N) != 1: os._exit(3)
        if now >= start_at: n += 1
    counts[i] = n
ts = [threading.Thread(target=worker, args=(i,)) for i in range(T)]; [t.start() for t in ts]
time.sleep(max(0, start_at - time.time())); r0 = resource.getrusage(resource.RUSAGE_SELF); s0 = scpu(); m0 = mstat()
time.sleep(max(0, stop - time.time())); r1 = resource.getrusage(resource.RUSAGE_SELF); s1 = scpu(); m1 = mstat()
[t.join() for t in ts]; n = max(1, sum(counts))
print("%.2f %d cli %.1f srv %.1f idle %.1f%%" % (n * N / secs / 1e9, n, (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e6, (s1 - s0) / n * 1e6, (m1 - m0) / os.sysconf("SC_CLK_TCK") / (2 * secs) * 100))
