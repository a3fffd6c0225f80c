#!/usr/bin/env python3
"""Batch GET throughput through the Python binding: N pages of S bytes per batch (default
128 x 256 KiB), read zero-copy into a preallocated host pool, reported in GB/s.

This is the Python side of the performance contract (SPEC §10: >= 80% of the Go client's
batch GET throughput in the same run); compare its JSON line with the Go client's figure.

    python bench/batch_get.py                        # starts build/dfkv_server on a temp dir
    python bench/batch_get.py --members n1=host:port # against a running server
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
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import dfkv  # noqa: E402


def start_server(repo: Path, tmp: str) -> "tuple[subprocess.Popen, str]":
    addr_file = Path(tmp) / "addr"
    proc = subprocess.Popen(
        [str(repo / "build" / "dfkv_server"), "--host", "127.0.0.1", "--port", "0",
         "--addr-file", str(addr_file), "--dir", str(Path(tmp) / "data"), "--cap", str(1 << 30)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if addr_file.is_file() and addr_file.read_text().strip():
            return proc, addr_file.read_text().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("dfkv_server did not start (is build/dfkv_server built?)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", help="id=host:port,...; default: start build/dfkv_server")
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=256 << 10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mode", choices=["into", "auto", "sg"], default="into",
                    help="batch_get_into (exact), batch_get_auto, or batch_get_auto_sg with 1 segment")
    ap.add_argument("--batch-concurrency", type=int, default=0)
    args = ap.parse_args()

    repo = HERE.parent.parent
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="dfkv-bench-")
    members = args.members
    if not members:
        proc, addr = start_server(repo, tmp.name)
        members = f"n1={addr}"
    try:
        with dfkv.Client(members, namespace=b"bench\x00batch_get",
                         batch_concurrency=args.batch_concurrency) as c:
            n, size = args.pages, args.page_size
            keys = [b"page\x00%08d" % i for i in range(n)]
            src = os.urandom(size)
            if not all(c.batch_put(keys, [src] * n)):
                raise SystemExit("batch_put failed")
            # One preallocated, pre-touched pool, as an engine's host KV pool would be.
            pool = bytearray(n * size)
            mv = memoryview(pool)
            bufs = [mv[i * size:(i + 1) * size] for i in range(n)]
            segs = [[b] for b in bufs]

            def once() -> bool:
                if args.mode == "into":
                    return all(c.batch_get_into(keys, bufs))
                if args.mode == "auto":
                    return all(ok for ok, _ in c.batch_get_auto(keys, bufs))
                return all(ok for ok, _ in c.batch_get_auto_sg(keys, segs))

            for _ in range(args.warmup):
                if not once():
                    raise SystemExit("warm-up batch missed")
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                ok = once()
                times.append(time.perf_counter() - t0)
                if not ok:
                    raise SystemExit("batch missed")
            if bytes(bufs[-1]) != src:
                raise SystemExit("data mismatch")
            total = n * size
            med = statistics.median(times)
            result = {
                "bench": "python_batch_get", "mode": args.mode, "pages": n, "page_size": size,
                "iters": args.iters, "median_s": med, "p10_s": sorted(times)[len(times) // 10],
                "gbps_median": total / med / 1e9, "gbps_mean": total * len(times) / sum(times) / 1e9,
                "transport": c.transport_mode, "lib_version": c.version(),
            }
            print(json.dumps(result))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        tmp.cleanup()


if __name__ == "__main__":
    main()
