#!/usr/bin/env python3
"""GPU-direct loads, device check (issue 32; docs/RDMA.md "GPU-direct loads: device check").

Run by tools/device/gpu-direct.sh against a dfkv_server it started. Standard library only
(torch is used for the device buffer when importable with CUDA, else dfkv._cuda allocates).

1. CUDA: device 0, its name, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.
2. PUTs one random value per size (default 4 KiB, 1 MiB, 16 MiB, 64 MiB).
3. control: GET into host memory (a bytearray), cuMemcpyHtoD into the device buffer, copy
   back (cuMemcpyDtoH) and compare byte-exact with what was PUT. Timed: GET + HtoD.
4. dmabuf: cuMemGetHandleForAddressRange(DMA_BUF_FD) over the whole device buffer.
5. direct (only with an RDMA NIC and a client on RDMA): Client.register_dmabuf(fd, 0, size,
   iova=device pointer), then GET straight into the device buffer, copy back and compare.
   Timed: the GET alone. The device buffer is overwritten with a poison pattern before every
   GET, so stale bytes of an earlier GET can never pass for a hit.

Prints ONE summary line, on every path (a refusal or an exception included):

  gpu-direct: <device> dmabuf=<ok|refused ...|not tried (...)> direct=<ok N/N|refused: ...|
  failed: ...|WRONG ...> control=<ok N/N|...> direct_gbps=.. control_gbps=.. [details]

*_gbps are gigabits per second (bytes*8/1e9 per second, over every size and repetition).
Exit status: 0 = bytes right or a clean refusal; 1 = wrong bytes anywhere; 2 = the check
itself could not run (no server, a PUT failed, an unexpected error).

--dry-run runs steps 2-3 without CUDA (the control compares the host copy): it shows the
server/client part works on a machine without a GPU. It proves nothing about GPU memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

DEFAULT_SIZES = [4 << 10, 1 << 20, 16 << 20, 64 << 20]
POISON = 0xA5


class Report:
    def __init__(self, out_dir: str):
        self.f = {"device": "?", "dmabuf": "not tried", "direct": "not tried",
                  "control": "not run", "direct_gbps": "-", "control_gbps": "-"}
        self.extra: dict = {}
        self.wrong = False
        self.broken = ""  # why the check itself could not run (exit 2)
        self.out = Path(out_dir) if out_dir else None
        self.logf = None
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            self.logf = open(self.out / "gpu-direct-driver.log", "a")

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.logf:
            self.logf.write(line + "\n")
            self.logf.flush()

    def line(self) -> str:
        f = self.f
        s = (f"gpu-direct: {f['device']} dmabuf={f['dmabuf']} direct={f['direct']} "
             f"control={f['control']} direct_gbps={f['direct_gbps']} control_gbps={f['control_gbps']}")
        if self.extra:
            s += " " + " ".join(f"{k}={v}" for k, v in self.extra.items())
        return s.replace("\n", " ")

    def finish(self) -> int:
        s = self.line()
        print(s, flush=True)
        if self.out:
            (self.out / "gpu-direct.summary").write_text(s + "\n")
        if self.logf:
            self.logf.write(s + "\n")
            self.logf.close()
        return 1 if self.wrong else (2 if self.broken else 0)


def short(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    if len(msg) > 300:
        msg = msg[:300] + "..."
    return f"{type(e).__name__}({msg})"


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes * 8 / seconds / 1e9:.2f}" if seconds > 0 else "-"


class DeviceBuffer:
    """One device allocation: torch (when importable with CUDA) or cuMemAlloc, rounded up to
    dfkv._cuda.EXPORT_ALIGN so the whole range is exportable as a DMA-BUF."""

    def __init__(self, cuda, size: int, want_torch: bool, rep: Report):
        self.cuda, self.size, self.tensor, self.kind = cuda, cuda.round_up(size), None, "cuMemAlloc"
        if want_torch:
            try:
                import torch  # optional
                if torch.cuda.is_available():
                    torch.cuda.set_device(0)
                    self.tensor = torch.empty(self.size, dtype=torch.uint8, device="cuda:0")
                    torch.cuda.synchronize()
                    self.kind = f"torch {torch.__version__}"
            except Exception as e:  # torch absent or unusable: the driver API does it
                rep.log(f"torch not used for the device buffer: {short(e)}")
                self.tensor = None
        if self.tensor is not None:
            self.ptr = int(self.tensor.data_ptr())
            page = os.sysconf("SC_PAGE_SIZE")
            if self.ptr % page:
                rep.log(f"torch pointer 0x{self.ptr:x} not page aligned; using cuMemAlloc")
                self.tensor, self.kind = None, "cuMemAlloc"
        if self.tensor is None:
            self.ptr = cuda.mem_alloc(self.size)
        cuda.init()  # torch may have switched contexts: ours (device 0's primary) current again

    def poison(self, n: int) -> None:
        self.cuda.memcpy_htod(self.ptr, bytes([POISON]) * n)

    def free(self) -> None:
        if self.tensor is not None:
            self.tensor = None
        else:
            self.cuda.mem_free(self.ptr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", required=True, help="n1=host:port of the dfkv_server")
    ap.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    ap.add_argument("--reps", type=int, default=3, help="timed GETs per size and path")
    ap.add_argument("--rdma-nic", default="", help="the RDMA device found (empty: none)")
    ap.add_argument("--dry-run", action="store_true", help="no CUDA: host-staging control only")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--deadline", type=float, default=360, help="seconds for the whole check")
    a = ap.parse_args()
    rep = Report(a.out)

    def on_alarm(signum, frame):
        raise TimeoutError(f"the check ran past its {a.deadline:.0f} s deadline")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(a.deadline))
    try:
        run(a, rep)
    except BaseException as e:  # every path ends in the summary line
        rep.broken = rep.broken or short(e)
        rep.log("unexpected: " + "".join(traceback.format_exception(e)).rstrip())
        for k in ("control", "direct"):
            if rep.f[k] in ("not run", "not tried", "running"):
                rep.f[k] = f"failed: {short(e)}"
    finally:
        signal.alarm(0)
    return rep.finish()


def run(a, rep: Report) -> None:
    sizes = [int(s) for s in a.sizes.split(",") if s]
    import dfkv
    from dfkv import _cuda as cuda
    from dfkv._buffers import RawBuffer

    rep.extra["rdma"] = a.rdma_nic or "none"
    buf = None
    if a.dry_run:
        rep.f["device"] = "dry-run(no CUDA)"
        rep.f["dmabuf"] = "not tried (dry run)"
        rep.f["direct"] = "not tried (dry run)"
    else:
        try:
            cuda.init()
            rep.f["device"] = cuda.device_name().replace(" ", "_")
            rep.extra["cuda_driver"] = cuda.driver_version()
        except (cuda.CudaUnavailable, cuda.CudaError) as e:
            rep.f["device"] = "no-usable-CUDA"
            rep.f["dmabuf"] = f"refused {short(e)}"
            rep.f["direct"] = "refused: no usable CUDA"
            rep.broken = short(e)
            return
        try:
            rep.extra["dmabuf_attr"] = cuda.dmabuf_supported()
        except cuda.CudaError as e:
            rep.extra["dmabuf_attr"] = f"{e.code}/{e.name}"
        buf = DeviceBuffer(cuda, max(sizes), not a.no_torch, rep)
        rep.extra["alloc"] = buf.kind.replace(" ", "_")
        rep.log(f"device {rep.f['device']}: buffer 0x{buf.ptr:x}+{buf.size} ({buf.kind}), "
                f"DMA_BUF_SUPPORTED={rep.extra['dmabuf_attr']}")

    ns = b"gpu-direct\x00" + uuid.uuid4().bytes
    values = {n: os.urandom(n) for n in sizes}
    keys = {n: f"gpu-direct/{n}".encode() for n in sizes}
    c = dfkv.Client(a.members, namespace=ns)
    try:
        rep.extra["transport"] = c.transport_mode.replace(" ", "_")
        rep.log(f"client transport {c.transport_mode}, library {dfkv._lib.loaded_path()}")
        for n in sizes:
            c.set(keys[n], values[n])  # raises (a dfkv.Error) on any failure
        rep.log(f"PUT {len(sizes)} values: {sizes}")
        control(a, rep, c, cuda, buf, sizes, keys, values)
        if buf is not None:
            try:
                direct(a, rep, c, cuda, RawBuffer, buf, sizes, keys, values)
            finally:
                buf.free()
    finally:
        c.close()


def control(a, rep, c, cuda, buf, sizes, keys, values) -> None:
    rep.f["control"] = "running"
    good, moved, spent = 0, 0, 0.0
    for n in sizes:
        host = bytearray(n)
        ok_all = True
        for r in range(a.reps):
            if buf is not None:
                buf.poison(n)
            host[:] = bytes([POISON]) * n
            t0 = time.perf_counter()
            hit = c.get_into(keys[n], host)
            if hit and buf is not None:
                cuda.memcpy_htod(buf.ptr, host)
            dt = time.perf_counter() - t0
            if not hit:
                rep.f["control"] = f"failed: GET {n} B missed ({c.last_error()})"
                rep.broken = rep.f["control"]
                return
            got = cuda.memcpy_dtoh(buf.ptr, n) if buf is not None else bytes(host)
            if got != values[n]:
                ok_all = False
                rep.wrong = True
                rep.log(f"control: WRONG bytes for {n} B (rep {r}): first diff at {first_diff(got, values[n])}")
            moved, spent = moved + n, spent + dt
        good += ok_all
        rep.log(f"control {n} B: {'ok' if ok_all else 'WRONG'} ({a.reps} reps)")
    rep.f["control"] = f"ok {good}/{len(sizes)}" if good == len(sizes) else f"WRONG {len(sizes) - good}/{len(sizes)}"
    rep.f["control_gbps"] = gbps(moved, spent)


def first_diff(a: bytes, b: bytes) -> int:
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))


def direct(a, rep, c, cuda, RawBuffer, buf, sizes, keys, values) -> None:
    import dfkv

    try:
        fd = cuda.export_dmabuf(buf.ptr, buf.size)
    except cuda.CudaError as e:
        rep.f["dmabuf"] = f"refused {e.code}/{e.name}"
        rep.f["direct"] = "refused: no DMA-BUF export"
        return
    except (cuda.CudaUnavailable, ValueError) as e:
        rep.f["dmabuf"] = f"refused {short(e)}"
        rep.f["direct"] = "refused: no DMA-BUF export"
        return
    rep.f["dmabuf"] = "ok"
    rep.log(f"DMA-BUF fd {fd} for 0x{buf.ptr:x}+{buf.size}")
    try:
        if not a.rdma_nic:
            rep.f["direct"] = "refused: no RDMA NIC: DMA-BUF registration not tried"
            return
        if not hasattr(c, "register_dmabuf"):
            rep.f["direct"] = "refused: this dfkv Python binding has no register_dmabuf"
            return
        try:
            c.register_dmabuf(fd, 0, buf.size, buf.ptr)
        except dfkv.Error as e:
            rep.f["direct"] = f"refused: register_dmabuf: {short(e)}"
            return
    finally:
        os.close(fd)  # the registration holds its own reference
    rep.log(f"registered with the client (transport {c.transport_mode})")
    rep.f["direct"] = "running"
    dev = RawBuffer(buf.ptr, buf.size, device=True)
    good, moved, spent = 0, 0, 0.0
    try:
        for n in sizes:
            dst = RawBuffer(buf.ptr, n, device=True)
            ok_all = True
            for r in range(a.reps):
                buf.poison(n)
                t0 = time.perf_counter()
                try:
                    hit = c.get_into(keys[n], dst)
                except dfkv.Error as e:
                    rep.f["direct"] = f"refused: {short(e)}" if isinstance(e, getattr(dfkv.errors, "DirectUnsupported", ())) \
                        else f"failed: {n} B: {short(e)}"
                    if not rep.f["direct"].startswith("refused"):
                        rep.broken = rep.f["direct"]
                    return
                dt = time.perf_counter() - t0
                if not hit:
                    exc = c.last_exception() if hasattr(c, "last_exception") else None
                    why = short(exc) if exc is not None else c.last_error()
                    if exc is not None and type(exc).__name__ == "DirectUnsupported":
                        rep.f["direct"] = f"refused: {why}"
                    else:
                        rep.f["direct"] = f"failed: GET {n} B: {why}"
                        rep.broken = rep.f["direct"]
                    return
                got = cuda.memcpy_dtoh(buf.ptr, n)
                if got != values[n]:
                    ok_all = False
                    rep.wrong = True
                    rep.log(f"direct: WRONG bytes for {n} B (rep {r}): first diff at {first_diff(got, values[n])}")
                moved, spent = moved + n, spent + dt
            good += ok_all
            rep.log(f"direct {n} B: {'ok' if ok_all else 'WRONG'} ({a.reps} reps)")
        rep.f["direct"] = f"ok {good}/{len(sizes)}" if good == len(sizes) else f"WRONG {len(sizes) - good}/{len(sizes)}"
        rep.f["direct_gbps"] = gbps(moved, spent)
    finally:
        try:
            c.unregister_dmabuf(dev.addr, dev.nbytes)
        except dfkv.Error as e:
            rep.log(f"unregister_dmabuf: {short(e)}")
            if rep.f["direct"].startswith("ok"):
                rep.f["direct"] += f"(unregister_failed:{type(e).__name__})"


if __name__ == "__main__":
    sys.exit(main())
