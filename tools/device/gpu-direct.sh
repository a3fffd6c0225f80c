#!/usr/bin/env bash
# GPU-direct loads, device check (issue 32; docs/RDMA.md "GPU-direct loads: device check").
#
#   bash tools/device/gpu-direct.sh            # on the GPU machine (under 10 minutes)
#   bash tools/device/gpu-direct.sh --dry-run  # anywhere: server + client + host control, no CUDA
#
# Without a CUDA GPU (no nvidia-smi and no libcuda.so.1, or nvidia-smi lists none) it prints
# "gpu-direct: no GPU here (<reason>)" and exits 0. Otherwise it gets dfkv_server and
# libdfkv.so (go build from this checkout when Go can build offline, else $DFKV_SERVER /
# $DFKV_LIB, else build/ — e.g. carried to the device machine), starts a dfkv_server on
# 127.0.0.1 ($DFKV_GPU_DIRECT_HOST) with a temp data dir (--rdma when /sys/class/infiniband
# lists a device), and runs tools/device/gpu_direct.py, which prints the one summary line.
# Results (summary, logs) go to $OUT when set. Exit: 0 ok or a clean refusal, 1 wrong bytes,
# 2 the check could not run. Every wait is bounded.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
out=${OUT:-}
[ -n "$out" ] && mkdir -p "$out"
work=$(mktemp -d /tmp/dfkv-gpu-direct.XXXXXX)
log=$work/gpu-direct.log
server_pid=""

note() { echo "gpu-direct: $*" >&2; echo "[$(date +%T)] $*" >>"$log"; }
collect() {
  if [ -n "$out" ]; then
    cp -f "$log" "$out/" 2>/dev/null || true
    [ -f "$work/server.log" ] && cp -f "$work/server.log" "$out/" 2>/dev/null || true
    [ -f "$work/build.log" ] && cp -f "$work/build.log" "$out/" 2>/dev/null || true
  fi
}
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  collect
  rm -rf "$work"
}
trap cleanup EXIT
# A summary line for the paths that end before the Python driver can print its own.
summary() {  # summary <device> <reason>
  local s="gpu-direct: $1 dmabuf=not tried direct=not tried control=failed: $2 direct_gbps=- control_gbps=-"
  echo "$s"
  echo "$s" >>"$log"
  [ -n "$out" ] && echo "$s" >"$out/gpu-direct.summary"
  return 0
}

# --- 1. is there a CUDA GPU? ------------------------------------------------------------
device="dry-run(no CUDA)"
if [ "$dry" = 0 ]; then
  has_smi=0 has_lib=0
  command -v nvidia-smi >/dev/null 2>&1 && has_smi=1
  if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' ||
     compgen -G '/usr/lib/x86_64-linux-gnu/libcuda.so.1' >/dev/null ||
     compgen -G '/usr/lib64/libcuda.so.1' >/dev/null ||
     compgen -G '/usr/local/nvidia/lib64/libcuda.so.1' >/dev/null; then
    has_lib=1
  fi
  if [ "$has_smi" = 0 ] && [ "$has_lib" = 0 ]; then
    s="gpu-direct: no GPU here (no nvidia-smi and no libcuda.so.1)"
    echo "$s"; [ -n "$out" ] && echo "$s" >"$out/gpu-direct.summary"
    exit 0
  fi
  if [ "$has_lib" = 0 ]; then
    s="gpu-direct: no GPU here (nvidia-smi present but no libcuda.so.1 in the loader's path)"
    echo "$s"; [ -n "$out" ] && echo "$s" >"$out/gpu-direct.summary"
    exit 0
  fi
  if [ "$has_smi" = 1 ]; then
    gpus=$(timeout 30 nvidia-smi -L 2>&1 || true)
    echo "$gpus" >>"$log"
    if ! grep -q '^GPU ' <<<"$gpus"; then
      s="gpu-direct: no GPU here (nvidia-smi -L lists none: $(head -n1 <<<"$gpus"))"
      echo "$s"; [ -n "$out" ] && echo "$s" >"$out/gpu-direct.summary"
      exit 0
    fi
    device=$(sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p' <<<"$gpus" | tr ' ' '_')
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$log" 2>&1 || true
  fi
  device=${device:-cuda}
fi
note "device: $device"

# --- 2. the binaries --------------------------------------------------------------------
bin=$work/bin
mkdir -p "$bin"
server=${DFKV_SERVER:-} lib=${DFKV_LIB:-}
if [ -z "$server" ] || [ -z "$lib" ]; then
  if command -v go >/dev/null 2>&1; then
    ver=$(cat VERSION 2>/dev/null || echo 0.1.0-dev)
    ld="-X github.com/dfkv/dfkv/go/internal/version.Version=$ver"
    # GOPROXY=off: the device machine reaches nothing, so a missing module fails at once.
    if GOPROXY=off GOFLAGS=-mod=readonly timeout 150 go build -trimpath -ldflags "$ld" \
         -o "$bin/dfkv_server" ./go/cmd/server >>"$work/build.log" 2>&1 &&
       GOPROXY=off GOFLAGS=-mod=readonly timeout 150 go build -trimpath -buildmode=c-shared \
         -ldflags "$ld -extldflags=-Wl,--version-script=$root/go/cmd/libdfkv/exports.map" \
         -o "$bin/libdfkv.so" ./go/cmd/libdfkv >>"$work/build.log" 2>&1; then
      server=${server:-$bin/dfkv_server} lib=${lib:-$bin/libdfkv.so}
      note "built dfkv_server and libdfkv.so from this checkout ($(git rev-parse --short HEAD 2>/dev/null || echo ?))"
    else
      note "go build failed (last lines below); trying prebuilt build/"
      tail -n 5 "$work/build.log" >&2 || true
    fi
  else
    note "no Go toolchain here; trying prebuilt build/"
  fi
  server=${server:-$root/build/dfkv_server} lib=${lib:-$root/build/libdfkv.so}
fi
for f in "$server" "$lib"; do
  if [ ! -f "$f" ]; then
    summary "$device" "no $(basename "$f") (go build failed or no Go; carry build/ or set DFKV_SERVER/DFKV_LIB)"
    exit 2
  fi
done
note "server $server ($(date -r "$server" +%FT%T)), library $lib ($(date -r "$lib" +%FT%T))"

# --- 3. the server ----------------------------------------------------------------------
nic=""
if [ "$dry" = 0 ] && [ -d /sys/class/infiniband ]; then
  nic=$(ls /sys/class/infiniband 2>/dev/null | head -n1 || true)
fi
rdma_flags=()
if [ -n "$nic" ]; then
  rdma_flags=(--rdma)
  note "RDMA device $nic: the server serves RDMA, the client asks for it (DFKV_RDMA=1)"
  export DFKV_RDMA=1 DFKV_RDMA_MAX_BLOCK=$((64 << 20))
elif [ "$dry" = 0 ]; then
  note "no RDMA NIC: DMA-BUF registration not tried"
fi
host=${DFKV_GPU_DIRECT_HOST:-127.0.0.1}
"$server" --host "$host" --port 0 --addr-file "$work/addr" --dir "$work/data" \
  --cap $((512 << 20)) --max-msg $((64 << 20)) "${rdma_flags[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
addr=""
for _ in $(seq 1 200); do  # 20 s
  kill -0 "$server_pid" 2>/dev/null || break
  [ -s "$work/addr" ] && addr=$(cat "$work/addr") && [ -n "$addr" ] && break
  sleep 0.1
done
if [ -z "$addr" ]; then
  tail -n 20 "$work/server.log" >&2 || true
  summary "$device" "dfkv_server did not start within 20 s (server.log)"
  exit 2
fi
note "dfkv_server at $addr (pid $server_pid)"
grep -i 'rdma' "$work/server.log" | head -n 5 >>"$log" || true

# --- 4. the driver ----------------------------------------------------------------------
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  summary "$device" "no $py"
  exit 2
fi
args=(--members "n1=$addr" --deadline 240)
[ "$dry" = 1 ] && args+=(--dry-run)
[ -n "$nic" ] && args+=(--rdma-nic "$nic")
[ -n "$out" ] && args+=(--out "$out")
rc=0
DFKV_LIB=$lib PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  timeout -k 10 270 "$py" tools/device/gpu_direct.py "${args[@]}" >"$work/driver.out" 2>>"$log" || rc=$?
cat "$work/driver.out"
if ! grep -q '^gpu-direct: ' "$work/driver.out"; then
  tail -n 20 "$log" >&2 || true
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    summary "$device" "the driver ran past 270 s (hung in a library call?)"
  else
    summary "$device" "the driver exited $rc without a summary (see gpu-direct.log)"
  fi
  [ "$rc" = 1 ] || rc=2
fi
exit "$rc"
