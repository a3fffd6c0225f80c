"""Shared fixtures: repository paths, and a real dfkv_server for the server-backed tests.

Server-backed tests load the real libdfkv.so (build/libdfkv.so, or $DFKV_LIB) and talk to a
real build/dfkv_server (or $DFKV_SERVER) started once per session on an ephemeral port. They
are skipped, with the reason, only when those build outputs are absent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO = PYTHON_DIR.parent
BUILD = REPO / "build"
SERVER_BIN = Path(os.environ["DFKV_SERVER"]) if os.environ.get("DFKV_SERVER") else BUILD / "dfkv_server"
LIB_PATH = Path(os.environ["DFKV_LIB"]) if os.environ.get("DFKV_LIB") else BUILD / "libdfkv.so"
GOLDEN = REPO / "testdata" / "golden" / "identity.json"
HEADER = REPO / "go" / "cmd" / "libdfkv" / "dfkv.h"


def missing_build() -> str:
    """Why server-backed tests cannot run here ("" when they can)."""
    missing = [str(p) for p in (LIB_PATH, SERVER_BIN) if not p.is_file()]
    return ("not built: " + ", ".join(missing) + " (run tools/build.sh)") if missing else ""


def run_python(code: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter that imports dfkv from this source tree."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PYTHON_DIR) + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def lib():
    """The real libdfkv.so loaded in this process (tests that need no server)."""
    if not LIB_PATH.is_file():
        pytest.skip(f"not built: {LIB_PATH} (run tools/build.sh)")
    os.environ.setdefault("DFKV_LIB", str(LIB_PATH))
    from dfkv import _lib

    return _lib.load()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """Address "host:port" of a dfkv_server running for the whole session."""
    yield from _run_server(tmp_path_factory, "dfkv_server")


@pytest.fixture(scope="session")
def small_server(tmp_path_factory):
    """A dfkv_server that accepts values of at most 300 bytes (--max-msg 300), for the
    object-size checks."""
    yield from _run_server(tmp_path_factory, "dfkv_server_small", "--max-msg", "300")


def _run_server(tmp_path_factory, name, *extra):
    why = missing_build()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp(name)
    addr_file = tmp / "addr"
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [str(SERVER_BIN), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(addr_file),
         # --max-msg explicit: without it a 256 MiB cache takes values up to 4 MiB only
         # (dfkv_server sizes the default to its capacity) and the connector tests move more.
         "--dir", str(tmp / "data"), "--cap", str(256 << 20), "--max-msg", str(64 << 20), *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        addr = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if addr_file.is_file():
                addr = addr_file.read_text().strip()
                if addr:
                    break
            time.sleep(0.02)
        if not addr:
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"dfkv_server did not write {addr_file} within 10 s (exit {proc.returncode}):\n"
                        + (tmp / "server.log").read_text(errors="replace")[-4000:])
        os.environ.setdefault("DFKV_LIB", str(LIB_PATH))  # subprocess tests load the same lib
        yield addr
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture(scope="session")
def members(server) -> str:
    return f"n1={server}"


@pytest.fixture
def namespace() -> bytes:
    """A fresh namespace per test (with a NUL in it), so tests never see each other's keys."""
    return b"pytest\x00" + uuid.uuid4().bytes


@pytest.fixture
def client(members, namespace):
    import dfkv

    c = dfkv.Client(members, namespace=namespace)
    yield c
    c.close()
