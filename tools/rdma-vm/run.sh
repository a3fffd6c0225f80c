#!/usr/bin/env bash
# Boots the dfkv RDMA guest (a Debian trixie userland, trixie-backports kernel, rdma-core;
# image.sh builds and caches it) non-interactively, runs one guest script in it, and exits
# with that script's status. The guest gets two 9p shares: SHARE read-only at /host (the
# binaries and test binaries the script needs; the script itself is copied in), OUT writable
# at /out (results). The serial console is the log, streamed here and kept in OUT/console.log.
#
#   tools/rdma-vm/run.sh [--share DIR] [--out DIR] [--timeout S] [--mem MiB] [--cpus N] SCRIPT [ARG...]
#
# KVM when /dev/kvm boots the guest within DFKV_VM_KVM_PROBE_S (default 25) seconds, TCG
# otherwise (this project's CI host has a nested /dev/kvm that hangs a stock guest kernel);
# DFKV_VM_ACCEL=kvm|tcg forces one. Environment variables named DFKV_TEST_* or DFKV_GUEST_*
# are passed into the guest script. Exit status: the script's; 124 when the guest ran past
# --timeout (default 900 s), 125 when it finished without reporting a status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
share=$root/build/rdma-vm/share out=$root/build/rdma-vm/out
timeout=900 mem=${DFKV_VM_MEM:-4096} cpus=${DFKV_VM_CPUS:-2}
while [ $# -gt 0 ]; do
  case $1 in
    --share) share=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    -*) echo "usage: tools/rdma-vm/run.sh [--share DIR] [--out DIR] [--timeout S] [--mem MiB] [--cpus N] SCRIPT [ARG...]" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "tools/rdma-vm/run.sh: no guest script" >&2; exit 2; }
script=$1
shift
[ -f "$script" ] || { echo "tools/rdma-vm/run.sh: no guest script $script" >&2; exit 2; }
step() { printf 'rdma-vm: %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }
t0=$(date +%s)

step "qemu"
qemu=$(command -v qemu-system-x86_64 || true)
[ -n "$qemu" ] || { echo "tools/rdma-vm/run.sh: qemu-system-x86_64 missing (apt-get install qemu-system-x86)" >&2; exit 1; }
"$qemu" --version | head -1

step "image"
img=$("$here/image.sh")
cat "$img/versions" 2>/dev/null | sed 's/^/  /'

step "shares: $share (read-only, /host) and $out (writable, /out)"
mkdir -p "$share/.dfkv-vm" "$out"
find "$out" -mindepth 1 -delete
cp "$here/guest/guest-init.sh" "$share/.dfkv-vm/guest-init.sh"
cp "$script" "$share/.dfkv-vm/script"
# The script's sibling *.sh files come along (it may source them from /host/.dfkv-vm/).
for f in "$(dirname "$script")"/*.sh; do cp "$f" "$share/.dfkv-vm/"; done
: >"$share/.dfkv-vm/args"
for a in "$@"; do printf '%s\n' "$a" >>"$share/.dfkv-vm/args"; done
env | grep -E '^DFKV_(TEST|GUEST)_[A-Z0-9_]*=' | sed "s/'/'\\\\''/g; s/=/='/; s/\$/'/; s/^/export /" >"$share/.dfkv-vm/env" || true
echo "$timeout" >"$share/.dfkv-vm/timeout"
log=$out/console.log

boot() { # accel -> runs qemu in the background, sets qpid
  local accel=$1 cpu=max
  [ "$accel" = kvm ] && cpu=host
  [ "$accel" = tcg ] && accel=tcg,thread=multi
  : >"$log"
  timeout -k 10 $((timeout + 120)) nice -n 10 "$qemu" -machine q35 -accel "$accel" -cpu "$cpu" \
    -smp "$cpus" -m "$mem" -kernel "$img/vmlinuz" -initrd "$img/initrd.cpio.zst" \
    -append "console=ttyS0 rdinit=/init panic=-1 loglevel=4" \
    -display none -monitor none -serial "file:$log" -no-reboot -nic none -device virtio-rng-pci \
    -virtfs "local,path=$share,mount_tag=host,security_model=none,readonly=on" \
    -virtfs "local,path=$out,mount_tag=out,security_model=none" </dev/null &
  qpid=$!
}
accel=${DFKV_VM_ACCEL:-}
if [ -z "$accel" ]; then
  accel=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    probe=${DFKV_VM_KVM_PROBE_S:-25}
    step "boot: probing KVM (the guest must reach its init within $probe s)"
    boot kvm
    for _ in $(seq $((probe * 2))); do
      grep -q 'dfkv-vm: init' "$log" 2>/dev/null && { accel=kvm; break; }
      kill -0 "$qpid" 2>/dev/null || break
      sleep 0.5
    done
    if [ "$accel" != kvm ]; then
      if kill -0 "$qpid" 2>/dev/null; then
        echo "rdma-vm: KVM did not boot the guest within $probe s; falling back to TCG (software emulation)"
      else
        echo "rdma-vm: QEMU with KVM exited at once (above); falling back to TCG (software emulation)"
      fi
      kill "$qpid" 2>/dev/null || true
      wait "$qpid" 2>/dev/null || true
    fi
  fi
fi
if [ "$accel" = kvm ] && [ -n "${qpid:-}" ] && kill -0 "$qpid" 2>/dev/null; then
  step "boot: KVM, ${cpus} vCPUs, ${mem} MiB"
else
  step "boot: $accel, ${cpus} vCPUs, ${mem} MiB, hard timeout $((timeout + 120)) s"
  boot "$accel"
fi
watch() { # streams the console until qemu exits; sets qrc
  tail --pid="$qpid" -n +1 -f "$log" 2>/dev/null | sed -u 's/\r$//' &
  tpid=$!
  qrc=0
  wait "$qpid" || qrc=$?
  sleep 0.5
  kill "$tpid" 2>/dev/null || true
  wait "$tpid" 2>/dev/null || true
}
watch
# Multi-threaded TCG now and then breaks the guest kernel's boot-time code patching (an
# "Oops: int3" and a panic before init runs): that boot, and only that, is tried once more.
if [ ! -s "$out/status" ] && ! grep -q 'dfkv-vm: guest:' "$log" && grep -q 'Kernel panic' "$log"; then
  cp "$log" "$out/console-panic.log"
  step "boot: the guest kernel panicked before the script started (kept in console-panic.log); booting once more"
  boot "${accel%%,*}"
  watch
fi

step "result"
if [ -s "$out/status" ]; then
  rc=$(cat "$out/status")
elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "rdma-vm: the guest ran past its hard timeout ($((timeout + 120)) s); killed"
  rc=124
else
  echo "rdma-vm: the guest stopped (qemu status $qrc) without reporting a status"
  rc=125
fi
echo "rdma-vm: guest script $(basename "$script") exited $rc; $(($(date +%s) - t0)) s in all ($accel)"
exit "$rc"
