"""The C ABI's GET fast path (go/cmd/libdfkv/fastget.c), through the real libdfkv.so and
real dfkv_server processes: dfkv_get and dfkv_get_auto are served in C, on sockets the Go
client dialed, routed by the ring the Go client published. What these tests pin down:

- it routes and hashes exactly as the Go client does: values PUT through Go on a
  three-node ring are all found by GETs served in C (a different owner would be a miss);
- it follows a membership change (MDS) instead of routing by a stale ring;
- misses, size contracts, a dead node, a stalled node and a restarted node give the same
  answers and errors as the Go path, within the same deadlines;
- it is really taken (dfkv_cabi_fast_gets_total), its GETs are in the client's metrics,
  and DFKV_CABI_FASTPATH=0 turns it off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import LIB_PATH, SERVER_BIN, missing_build, run_python

pytestmark = pytest.mark.server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One dfkv_server on a fixed loopback port (so it can restart on the same address)."""

    def __init__(self, tmp: Path, name: str, *extra: str):
        self.dir, self.port, self.extra, self.proc = tmp / name, free_port(), extra, None
        self.addr = f"127.0.0.1:{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> "Node":
        addr_file = self.dir / "addr"
        if addr_file.exists():
            addr_file.unlink()
        self.proc = subprocess.Popen(
            [str(SERVER_BIN), "--host", "127.0.0.1", "--port", str(self.port), "--addr-file", str(addr_file),
             "--dir", str(self.dir / "data"), "--cap", str(64 << 20), "--log-level", "warn", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not (addr_file.is_file() and addr_file.read_text().strip()):
            assert self.proc.poll() is None, f"dfkv_server exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "dfkv_server did not start within 10 s"
            time.sleep(0.02)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def nodes(tmp_path):
    why = missing_build()
    if why:
        pytest.skip(why)
    os.environ.setdefault("DFKV_LIB", str(LIB_PATH))
    made = []

    def make(n: int, *extra: str):
        for i in range(n):
            made.append(Node(tmp_path, f"n{len(made) + 1}", *extra).start())
        return made

    yield make
    for n in made:
        if n.proc is not None and n.proc.poll() is None:
            os.kill(n.proc.pid, signal.SIGCONT)
        n.stop()


def open_sockets() -> int:
    """Sockets this process holds."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


@contextlib.contextmanager
def client_on(ns, namespace):
    """A client of the nodes ns, closed on the way out."""
    import dfkv

    c = dfkv.Client(members_of(ns), namespace=namespace)
    try:
        yield c
    finally:
        c.close()


def members_of(ns) -> str:
    return ",".join(f"n{i + 1}={n.addr}" for i, n in enumerate(ns))


def stats(c) -> dict:
    out = {}
    for line in c.stats_snapshot().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def value(i: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(100 + (i * 37) % 5000))


def test_fast_path_routes_like_go_on_three_nodes(nodes, namespace):
    ns = nodes(3)
    with client_on(ns, namespace) as c:
        n = 300
        for i in range(n):
            assert c.put(b"key-%d" % i, value(i))
        s0 = stats(c)
        assert s0["dfkv_cabi_fast_enabled"] == 1
        for i in range(n):
            v = value(i)
            buf = bytearray(len(v))
            assert c.get_into(b"key-%d" % i, buf), (i, c.last_error())
            assert buf == v
        for i in range(0, n, 3):  # dfkv_get_auto: a larger buffer, the length comes back
            buf = bytearray(8000)
            assert c.get_auto(b"key-%d" % i, buf) == (True, len(value(i)))
            assert bytes(buf[: len(value(i))]) == value(i)
        s1 = stats(c)
        served = n + len(range(0, n, 3))
        assert s1["dfkv_cabi_fast_gets_total"] - s0["dfkv_cabi_fast_gets_total"] == served
        assert s1["dfkv_cabi_fast_fallbacks_total"] == s0["dfkv_cabi_fast_fallbacks_total"]
        # One caller thread: one socket per node, dialed by Go and handed over.
        assert s1["dfkv_cabi_fast_dials_total"] == 3 and s1["dfkv_cabi_fast_conns"] == 3
        # Every GET served in C is in the client's metrics as a hit, with its bytes.
        ok = 'dfkv_client_ops_total{op="get",result="ok"}'
        assert s1[ok] - s0.get(ok, 0) == served
        moved = 'dfkv_client_value_bytes_total{op="get"}'
        want = sum(len(value(i)) for i in range(n)) + sum(len(value(i)) for i in range(0, n, 3))
        assert s1[moved] - s0.get(moved, 0) == want
        count = 'dfkv_client_op_duration_seconds_count{op="get"}'
        assert s1[count] - s0.get(count, 0) == served


def test_key_lengths_hash_as_go_does(nodes):
    ns = nodes(3)
    # SHA-256 block edges (55/56/64 bytes with the framing), multi-block and long keys, a
    # NUL-heavy binary key, and a long namespace.
    for namespace in (b"", b"n\x00s", bytes(range(256)) * 12):
        with client_on(ns, namespace) as c:
            keys = [b"k" * n for n in (1, 31, 32, 39, 40, 47, 48, 55, 56, 64, 119, 5000, 70000)]
            keys.append(bytes(300))
            for i, k in enumerate(keys):
                assert c.put(k, b"%d" % i * 50)
            s0 = stats(c)
            for i, k in enumerate(keys):
                assert c.get(k, len(b"%d" % i * 50)) == b"%d" % i * 50, (len(namespace), len(k))
            s1 = stats(c)
            assert s1["dfkv_cabi_fast_gets_total"] - s0["dfkv_cabi_fast_gets_total"] == len(keys)
            assert s1["dfkv_cabi_fast_fallbacks_total"] == s0["dfkv_cabi_fast_fallbacks_total"]


def test_misses_and_size_contracts_answer_as_go_does(nodes, namespace):
    ns = nodes(1)
    with client_on(ns, namespace) as c:
        assert c.put(b"k", b"0123456789")
        s0 = stats(c)
        assert c.get_into(b"absent", bytearray(10)) is False
        assert c.last_error() == "dfkv: not found"
        s1 = stats(c)
        assert s1["dfkv_cabi_fast_gets_total"] - s0["dfkv_cabi_fast_gets_total"] == 1
        miss = 'dfkv_client_ops_total{op="get",result="miss"}'
        assert s1[miss] - s0.get(miss, 0) == 1
        # The wrong exact size and a too-small capacity are the Go client's answers (the C
        # side hands the call over), with its message.
        assert c.get_into(b"k", bytearray(5)) is False
        assert "stored 10 bytes, asked 5" in c.last_error()
        assert c.get_auto(b"k", bytearray(4)) == (False, 0)
        assert "stored 10 bytes" in c.last_error()
        s2 = stats(c)
        assert s2["dfkv_cabi_fast_fallbacks_total"] - s1["dfkv_cabi_fast_fallbacks_total"] == 2
        assert c.get(b"k", 10) == b"0123456789"


def test_dead_node_cools_down_and_others_stay_fast(nodes, namespace, monkeypatch):
    monkeypatch.setenv("DFKV_PEER_COOLDOWN_MS", "60000")
    ns = nodes(2)
    with client_on(ns, namespace) as c:
        keys = [b"d-%d" % i for i in range(40)]
        for k in keys:
            assert c.put(k, k * 10)
        for k in keys:  # every node now has a pooled socket in C
            assert c.get(k, len(k) * 10) == k * 10
        ns[1].stop(signal.SIGKILL)
        answers = [c.get_into(k, bytearray(len(k) * 10)) for k in keys]
        errors = []
        for k, ok in zip(keys, answers):
            if not ok:
                errors.append(c.get_into(k, bytearray(len(k) * 10)) or c.last_error())
        assert 0 < answers.count(False) < len(keys), "both nodes must own some keys"
        # A dead node's keys are misses with the reason, at once (cooling down), never hangs.
        assert all("cooling down" in e and "unavailable" in e for e in errors), errors
        s0 = stats(c)
        alive = [k for k, ok in zip(keys, answers) if ok]
        for k in alive:
            assert c.get(k, len(k) * 10) == k * 10
        assert stats(c)["dfkv_cabi_fast_gets_total"] - s0["dfkv_cabi_fast_gets_total"] == len(alive)


def test_stalled_node_times_out_within_the_deadline(nodes, namespace, monkeypatch):
    monkeypatch.setenv("DFKV_IO_TIMEOUT_MS", "1000")
    ns = nodes(1)
    with client_on(ns, namespace) as c:
        assert c.put(b"s", b"x" * 1000)
        assert c.get(b"s", 1000) == b"x" * 1000  # a pooled socket in C
        os.kill(ns[0].proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            assert c.get_into(b"s", bytearray(1000)) is False
            took = time.monotonic() - t0
            err = c.last_error()
        finally:
            os.kill(ns[0].proc.pid, signal.SIGCONT)
        assert "timeout" in err, err
        # The 1 s deadline once: handing the call to the Go path after it would wait twice.
        assert 0.9 < took < 1.6, took
        s = stats(c)
        assert s['dfkv_client_ops_total{op="get",result="error"}'] >= 1
        assert s["dfkv_client_peer_cooldowns_total"] >= 1


def test_restarted_node_stale_socket_is_replaced(nodes, namespace):
    ns = nodes(1)
    with client_on(ns, namespace) as c:
        assert c.put(b"r", b"persisted value")
        assert c.get(b"r", 15) == b"persisted value"
        ns[0].stop()
        ns[0].start()  # same address, same data directory: the value survives
        s0 = stats(c)
        # The pooled socket is dead: the Go client repeats the GET on a fresh connection.
        assert c.get(b"r", 15) == b"persisted value"
        s1 = stats(c)
        assert s1["dfkv_cabi_fast_fallbacks_total"] - s0["dfkv_cabi_fast_fallbacks_total"] == 1
        assert s1["dfkv_cabi_fast_conns"] == 0
        # The next GET is served in C again, on a new socket.
        assert c.get(b"r", 15) == b"persisted value"
        s2 = stats(c)
        assert s2["dfkv_cabi_fast_gets_total"] - s1["dfkv_cabi_fast_gets_total"] == 1
        assert s2["dfkv_cabi_fast_dials_total"] - s1["dfkv_cabi_fast_dials_total"] == 1


def test_threads_share_the_pool_and_close_is_safe(nodes, namespace):
    import dfkv

    ns = nodes(2)
    warm = dfkv.Client(members_of(ns), namespace=namespace)  # the library's own descriptors
    assert warm.put(b"w", b"w") and warm.get(b"w", 1) == b"w"
    warm.close()
    sockets_before = open_sockets()
    c = dfkv.Client(members_of(ns), namespace=namespace)
    keys = [b"t-%d" % i for i in range(64)]
    for k in keys:
        assert c.put(k, k * 100)
    failures, stop = [], threading.Event()

    def worker(tid: int) -> None:
        i = tid
        while not stop.is_set():
            k = keys[i % len(keys)]
            buf = bytearray(len(k) * 100)
            try:
                ok = c.get_into(k, buf)
            except Exception:  # the client closed under us: the wrapper refuses the call
                return
            if ok and buf != k * 100:
                failures.append(k)
            i += 7

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    [t.start() for t in ts]
    time.sleep(0.5)
    s = stats(c)
    assert s["dfkv_cabi_fast_gets_total"] > 100
    assert s["dfkv_cabi_fast_conns"] <= 6 * 2
    c.close()  # while the threads are still calling
    stop.set()
    [t.join(timeout=30) for t in ts]
    assert not any(t.is_alive() for t in ts)
    assert failures == []
    # Every socket the C side held, idle or in use when the client closed, is closed.
    assert open_sockets() == sockets_before


def test_env_turns_the_fast_path_off(nodes):
    ns = nodes(1)
    code = f"""
import dfkv
c = dfkv.Client({members_of(ns)!r}, namespace=b"off")
assert c.put(b"k", b"v" * 100)
assert c.get(b"k", 100) == b"v" * 100
s = dict(l.rsplit(" ", 1) for l in c.stats_snapshot().splitlines() if l.startswith("dfkv_cabi_fast"))
print(s["dfkv_cabi_fast_enabled"], s["dfkv_cabi_fast_gets_total"])
c.close()
"""
    off = run_python(code, env={"DFKV_CABI_FASTPATH": "0"})
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["0", "0"]
    on = run_python(code)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["1", "1"]


def test_follows_a_membership_change(tmp_path, namespace):
    import dfkv

    from test_mds import run_cluster, stop, wait_file

    with run_cluster(tmp_path) as mds:
        c = dfkv.Client(mds_endpoints=[mds], mds_group="py", mds_poll_ms=100, namespace=namespace)
        n2 = None
        try:
            deadline = time.monotonic() + 15
            while stats(c)["dfkv_cabi_fast_ring_members"] != 1:
                assert time.monotonic() < deadline, "the first node never reached the C side's ring"
                time.sleep(0.02)
            assert c.put(b"before", b"one node")
            g0 = stats(c)["dfkv_cabi_fast_gets_total"]
            assert c.get(b"before", 8) == b"one node"
            assert stats(c)["dfkv_cabi_fast_gets_total"] == g0 + 1  # served in C, one-node ring
            n2 = subprocess.Popen(
                [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(tmp_path / "n2.addr"),
                 "--dir", str(tmp_path / "n2"), "--cap", str(64 << 20), "--log-level", "warn",
                 "--mds", mds, "--group", "py", "--id", "py-n2", "--advertise", "127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_file(tmp_path / "n2.addr", n2, "second dfkv_server")
            while stats(c).get("dfkv_client_mds_members", 0) != 2:
                assert time.monotonic() < deadline + 15, "the second node never reached the ring"
                time.sleep(0.05)
            # PUTs go through Go by the two-node ring. A C side still routing by the old ring
            # would look for about half of them on the wrong node and miss.
            keys = [b"after-%d" % i for i in range(200)]
            for k in keys:
                assert c.put(k, k * 3)
            while stats(c)["dfkv_cabi_fast_ring_members"] != 2:  # published within 50 ms
                assert time.monotonic() < deadline + 20, "the C side never got the new ring"
                time.sleep(0.01)
            s0 = stats(c)
            misses = [k for k in keys if c.get(k, len(k) * 3) != k * 3]
            s1 = stats(c)
            assert misses == []
            assert s1["dfkv_cabi_fast_gets_total"] - s0["dfkv_cabi_fast_gets_total"] == len(keys)
            assert s1["dfkv_cabi_fast_dials_total"] == 2
        finally:
            c.close()
            if n2 is not None:
                stop(n2)


class FakeNode:
    """A dfkv node that answers HELLO properly and each GET as the test scripts it by object
    id: the replies a broken or hostile server could send. Thread per connection; bounded by
    the test's own calls."""

    def __init__(self):
        import struct

        self.struct = struct
        self.script = {}  # id hi -> (behaviour, value)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "%s:%d" % self.sock.getsockname()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _reply(self, c, op, status, value_len=0, payload=b"", payload_len=None, magic=0x314B4644):
        n = len(payload) if payload_len is None else payload_len
        c.sendall(self.struct.pack("<IBBHIIQQ", magic, op, status, 1, 0, 0, value_len, n) + payload)

    def _hello(self):
        import flatbuffers

        from dfkv._fb import control_generated as cg

        b = flatbuffers.Builder(128)
        sv, tr = b.CreateString("fake"), b.CreateString("tcp")
        cg.HelloStart(b)
        cg.HelloAddProtocolVersion(b, 1)
        cg.HelloAddMinProtocolVersion(b, 1)
        cg.HelloAddMaxValueBytes(b, 1 << 26)
        cg.HelloAddMaxBatchItems(b, 1024)
        cg.HelloAddMaxDepth(b, 1)
        cg.HelloAddSoftwareVersion(b, sv)
        cg.HelloAddTransport(b, tr)
        b.Finish(cg.HelloEnd(b))
        return bytes(b.Output())

    def _serve(self, c):
        try:
            while True:
                hdr = b""
                while len(hdr) < 64:
                    chunk = c.recv(64 - len(hdr))
                    if not chunk:
                        return
                    hdr += chunk
                _, op, _, _, _, _, _, hi, _, _, length, plen = self.struct.unpack("<IBBHIIQQQQQQ", hdr)
                while plen:
                    plen -= len(c.recv(min(plen, 1 << 16)))
                if op == 2:  # HELLO
                    self._reply(c, 2, 0, payload=self._hello())
                    continue
                what, value = self.script.get(hi, ("missing", b""))
                if what == "ok":
                    self._reply(c, 4, 0, len(value), value)
                elif what == "missing":
                    self._reply(c, 4, 1)
                elif what == "unknown_status":
                    self._reply(c, 4, 200)
                elif what == "status_with_payload":
                    self._reply(c, 4, 1, 0, value)
                elif what == "longer_than_asked":
                    self._reply(c, 4, 0, length + 8, value + b"12345678")
                elif what == "shorter_exact":
                    self._reply(c, 4, 0, len(value) - 1, value[:-1])
                elif what == "bad_magic":
                    self._reply(c, 4, 0, len(value), value, magic=0xDEADBEEF)
                elif what == "wrong_op":
                    self._reply(c, 3, 0, len(value), value)
                elif what == "cut":
                    self._reply(c, 4, 0, len(value), value[: len(value) // 2], payload_len=len(value))
                    c.close()
                    return
        except OSError:
            return


def test_misbehaving_server_never_yields_wrong_bytes(lib, namespace, monkeypatch):
    """Each malformed reply, seen first by the C side, is either a clean failure or the Go
    client's answer after it repeats the request: never a hit with bytes the server did not
    store for that key, never a hang."""
    import dfkv

    monkeypatch.setenv("DFKV_IO_TIMEOUT_MS", "2000")
    monkeypatch.setenv("DFKV_PEER_COOLDOWN_MS", "1")  # every case starts from a usable peer
    node = FakeNode()
    c = dfkv.Client(f"f1={node.addr}", namespace=namespace)
    try:
        value = bytes(range(256)) * 16
        node.script[c.object_id(b"good").hi] = ("ok", value)
        buf = bytearray(len(value))
        assert c.get_into(b"good", buf) and buf == value  # the fake speaks the protocol
        assert stats(c)["dfkv_cabi_fast_gets_total"] == 1
        for what in ("unknown_status", "status_with_payload", "longer_than_asked", "shorter_exact",
                     "bad_magic", "wrong_op", "cut"):
            key = what.encode()
            node.script[c.object_id(key).hi] = (what, value)
            s0 = stats(c)
            buf = bytearray(b"\xee" * len(value))
            t0 = time.monotonic()
            ok = c.get_into(key, buf)
            took = time.monotonic() - t0
            assert ok is False, what
            assert took < 1.5, (what, took)  # a clean answer, not a deadline
            assert c.last_error(), what
            s1 = stats(c)
            assert s1["dfkv_cabi_fast_fallbacks_total"] - s0["dfkv_cabi_fast_fallbacks_total"] == 1, what
            time.sleep(0.01)  # past the 1 ms cool-down a protocol error may have started
            # The socket the bad reply left behind is gone: the good key still reads right.
            buf = bytearray(len(value))
            assert c.get_into(b"good", buf) and buf == value, what
    finally:
        c.close()
        node.close()
