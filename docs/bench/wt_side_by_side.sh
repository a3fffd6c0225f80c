#!/bin/bash
# Write-through PUT and warm GET of several dfkv_server binaries side by side (same machine,
# same moment), the order rotating by round; docs/bench/sections/write-path.md uses it with a
# copy of the same binary as a control for the method's spread.
#   docs/bench/wt_side_by_side.sh build/dfkv_bench 6 new=build/dfkv_server base=/tmp/base/build/dfkv_server copy=/tmp/copy/dfkv_server
set -u
BENCH=$1 N=$2; shift 2
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; sleep 0.5; rm -rf $T' EXIT
names=()
for a in "$@"; do n=${a%%=*}; bin=${a#*=}; names+=($n)
  $bin --host 127.0.0.1 --port 0 --addr-file $T/$n.addr --dir $T/$n --cap 4GiB --store-engine slab --log-level warn \
    --ram-tier --ram-tier-bytes $((1024<<20)) --ram-tier-policy write-through > $T/$n.log 2>&1 &
done
for i in $(seq 100); do ok=1; for n in ${names[@]}; do [ -s $T/$n.addr ] || ok=0; done; [ $ok = 1 ] && break; sleep 0.2; done
g() { python3 -c 'import json,sys;print("%.3f"%json.load(sys.stdin)["gb_per_s"])'; }
for r in $(seq $N); do
  k=$((r % ${#names[@]})); order=("${names[@]:$k}" "${names[@]:0:$k}")
  line="round $r:"
  for op in put get; do for n in ${order[@]}; do
    extra=""; [ $op = get ] && extra="--seed"
    v=$($BENCH --json --target dfkv --node $(cat $T/$n.addr) --op $op --size 1MiB --conns 4 --keys 256 --ns wt --duration 3s --warmup 0.5s --strict $extra 2>/dev/null | g)
    line="$line $n.$op=$v"
  done; done
  echo "$line"
done
