#!/usr/bin/env python3
"""Python binding vs Go client: batch GET of 128 pages x 256 KiB, side by side in one run.

SPEC §10 asks the ctypes path to reach >= 80% of the Go client's batch GET throughput. Both
sides read the same page count and size from one dfkv_server started here with the RAM tier
on (so the disk does not hide client overhead), one caller each, alternating rounds so that
this shared VM's drift affects both alike. The Go side is build/dfkv_bench
(--op get --batch 128 --conns 1); the Python side is dfkv.Client.batch_get_into into a
preallocated pool. Prints one JSON line per round and ends with

    python_batch_get_128x256KiB python/go=R (python X GB/s, go Y GB/s, median of N rounds)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

import dfkv  # noqa: E402


def start_server(tmp: str) -> "tuple[subprocess.Popen, str]":
    addr_file = Path(tmp) / "addr"
    proc = subprocess.Popen(
        [str(REPO / "build" / "dfkv_server"), "--host", "127.0.0.1", "--port", "0", "--addr-file", str(addr_file),
         "--dir", str(Path(tmp) / "data"), "--cap", "2GiB", "--ram-tier", "--ram-tier-bytes", "512MiB",
         "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if addr_file.is_file() and addr_file.read_text().strip():
            return proc, addr_file.read_text().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("dfkv_server did not start (run tools/build.sh)")


def go_round(addr: str, pages: int, size: int, seconds: float, seed: bool) -> float:
    cmd = [str(REPO / "build" / "dfkv_bench"), "--node", addr, "--op", "get", "--batch", str(pages),
           "--size", str(size), "--keys", str(pages), "--conns", "1", "--duration", f"{seconds}s",
           "--max-time", f"{seconds * 4 + 30}s", "--json", "--ns", "vs-go"]
    if seed:
        cmd.append("--seed")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 60)
    if out.returncode != 0:
        raise SystemExit(f"dfkv_bench failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["gb_per_s"]


def py_round(c: "dfkv.Client", keys, bufs, seconds: float) -> float:
    total, t0 = 0, time.perf_counter()
    while True:
        if not all(c.batch_get_into(keys, bufs)):
            raise SystemExit("python batch missed")
        total += sum(len(b) for b in bufs)
        el = time.perf_counter() - t0
        if el >= seconds:
            return total / el / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=256 << 10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="dfkv-vs-go-")
    proc, addr = start_server(tmp.name)
    try:
        with dfkv.Client(f"n1={addr}", namespace=b"vs-go\x00python") as c:
            n, size = args.pages, args.page_size
            keys = [b"page-%06d" % i for i in range(n)]
            src = os.urandom(size)
            if not all(c.batch_put(keys, [src] * n)):
                raise SystemExit("python seed failed")
            pool = bytearray(n * size)
            mv = memoryview(pool)
            bufs = [mv[i * size:(i + 1) * size] for i in range(n)]
            py_round(c, keys, bufs, 0.5)  # warm connections
            go, py = [], []
            for r in range(args.rounds):
                go.append(go_round(addr, n, size, args.seconds, seed=(r == 0)))
                py.append(py_round(c, keys, bufs, args.seconds))
                print(json.dumps({"round": r, "go_gbps": round(go[-1], 3), "python_gbps": round(py[-1], 3)}),
                      flush=True)
            if bytes(bufs[-1]) != src:
                raise SystemExit("data mismatch")
            g, p = statistics.median(go), statistics.median(py)
            print(f"python_batch_get_{n}x{size >> 10}KiB python/go={p / g:.2f} "
                  f"(python {p:.2f} GB/s, go {g:.2f} GB/s, median of {args.rounds} rounds)")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        tmp.cleanup()


if __name__ == "__main__":
    main()
