"""MDS discovery and client registration through the real libdfkv.so (dfkv_open_v2 with
mds_endpoints): a real dfkv_mds with its embedded etcd, a real dfkv_server that registers
itself, and dfkvctl to observe the registered client. Skipped only when the build outputs
are absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import BUILD, LIB_PATH, SERVER_BIN

MDS_BIN = Path(os.environ["DFKV_MDS"]) if os.environ.get("DFKV_MDS") else BUILD / "dfkv_mds"
CTL_BIN = BUILD / "dfkvctl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_file(path: Path, proc: subprocess.Popen, what: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}")
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    pytest.fail(f"{what} did not start within {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def run_cluster(tmp_path: Path, lease_ttl: str = "2s") -> Iterator[str]:
    """A real dfkv_mds (embedded etcd) and a dfkv_server registered with it as py-n1 in
    group "py"; yields the MDS address. Skips only when the build outputs are absent."""
    missing = [str(p) for p in (LIB_PATH, SERVER_BIN, MDS_BIN, CTL_BIN) if not p.is_file()]
    if missing:
        pytest.skip("not built: " + ", ".join(missing) + " (run tools/build.sh)")
    os.environ.setdefault("DFKV_LIB", str(LIB_PATH))
    procs = []
    try:
        mds = subprocess.Popen(
            [str(MDS_BIN), "--listen", "0", "--addr-file", str(tmp_path / "mds.addr"),
             "--etcd", f"embedded:{tmp_path / 'etcd'}", "--etcd-client-addr", f"127.0.0.1:{free_port()}",
             "--etcd-peer-addr", f"127.0.0.1:{free_port()}", "--lease-ttl", lease_ttl, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(mds)
        mds_addr = wait_file(tmp_path / "mds.addr", mds, "dfkv_mds")
        srv = subprocess.Popen(
            [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(tmp_path / "srv.addr"),
             "--dir", str(tmp_path / "data"), "--cap", str(256 << 20), "--log-level", "warn",
             "--mds", mds_addr, "--group", "py", "--id", "py-n1", "--advertise", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(srv)
        wait_file(tmp_path / "srv.addr", srv, "dfkv_server")
        yield mds_addr
    finally:
        for p in reversed(procs):
            stop(p)


@pytest.fixture
def mds_cluster(tmp_path):
    with run_cluster(tmp_path) as addr:
        yield addr


def ctl_json(*args: str) -> dict:
    out = subprocess.run([str(CTL_BIN), *args, "--json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_mds_discovery_and_registration(mds_cluster, namespace):
    import dfkv

    deadline = time.monotonic() + 10
    while not ctl_json("ring", "--mds", mds_cluster, "--group", "py")["members"]:
        assert time.monotonic() < deadline, "node never registered"
        time.sleep(0.1)
    c = dfkv.Client(mds_endpoints=[mds_cluster], mds_group="py", mds_poll_ms=200, namespace=namespace,
                    client_id="pytest-client", client_info={"engine": "pytest"}, client_heartbeat_ms=300)
    try:
        assert c.put(b"k", b"value through the MDS ring")
        assert c.get(b"k", len(b"value through the MDS ring")) == b"value through the MDS ring"
        clients = ctl_json("clients", "--mds", mds_cluster, "--group", "py")["clients"]
        assert [x["id"] for x in clients] == ["pytest-client"]
        assert clients[0]["info"] == {"engine": "pytest"}
        assert "dfkv_client_mds_polls_total" in c.stats_snapshot()
    finally:
        c.close()
    # Closing deregisters at once (no TTL wait).
    assert ctl_json("clients", "--mds", mds_cluster, "--group", "py")["clients"] == []


def test_mds_registration_opt_out(mds_cluster, namespace, monkeypatch):
    import dfkv

    monkeypatch.setenv("DFKV_CLIENT_REGISTER", "0")
    c = dfkv.Client(mds_endpoints=mds_cluster, mds_group="py", namespace=namespace, client_id="nope")
    try:
        time.sleep(0.3)
        assert ctl_json("clients", "--mds", mds_cluster, "--group", "py")["clients"] == []
    finally:
        c.close()
