"""Shared pieces of the Python drivers in docs/bench: timed worker threads, full socket reads,
and CPU accounting over the measured window only (BENCHMARKS, "C ABI" parts 3 and 4)."""
import os
import resource
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def fail(msg):
    """Stop the whole run: a SystemExit raised in a worker thread would end only that thread,
    and the run would report a rate as if nothing had gone wrong."""
    print(msg, file=sys.stderr, flush=True)
    os._exit(3)


def readinto(s, mv, flags=0):
    """Fill the memoryview mv from socket s."""
    while len(mv):
        r = s.recv_into(mv, len(mv), flags)
        if r == 0:
            fail("the server closed the connection")
        mv = mv[r:]


def machine_idle():
    f = open("/proc/stat").readline().split()[1:]
    return int(f[3]) + int(f[4])  # idle + iowait, in ticks


def process_cpu(pid):
    f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def run(worker, threads, secs, size, server_pid=None, lead=0.4):
    """Runs worker(i, step) on threads threads; the worker sets up, then calls step(op) with op
    a function doing one request. Requests are counted from lead seconds after the start, for
    secs seconds. Returns GB/s and GETs, and with server_pid the client's and the server's CPU
    per GET (µs) and the machine's idle share (%) over the same window."""
    start_at = time.time() + lead
    stop = start_at + secs
    counts = [0] * threads

    def body(i):
        def step(op):
            n = 0
            while True:
                now = time.time()
                if now > stop:
                    break
                op()
                if now >= start_at:
                    n += 1
            counts[i] = n

        try:
            worker(i, step)
        except Exception as e:  # noqa: BLE001 - any failure ends the run, never a low rate
            fail("thread %d: %r" % (i, e))

    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    time.sleep(max(0, start_at - time.time()))
    r0, s0, m0 = resource.getrusage(resource.RUSAGE_SELF), server_pid and process_cpu(server_pid), machine_idle()
    time.sleep(max(0, stop - time.time()))
    r1, s1, m1 = resource.getrusage(resource.RUSAGE_SELF), server_pid and process_cpu(server_pid), machine_idle()
    for t in ts:
        t.join()
    n = max(1, sum(counts))
    out = {"gb_per_s": n * size / secs / 1e9, "gets": n}
    if server_pid:
        out["client_us"] = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e6
        out["server_us"] = (s1 - s0) / n * 1e6
        out["idle_pct"] = (m1 - m0) / TICK / (os.cpu_count() * secs) * 100
    return out


def cpu_line(r):
    """The line cabi_cpu_ratio.py and cgo_tax/xclient.py print."""
    return "%.2f GB/s  %d GETs  client %.1f us/GET  server %.1f us/GET  client/server %.2f  idle %.1f%%" % (
        r["gb_per_s"], r["gets"], r["client_us"], r["server_us"],
        r["client_us"] / r["server_us"] if r["server_us"] else 0, r["idle_pct"])
