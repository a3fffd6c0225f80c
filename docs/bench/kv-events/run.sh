#!/usr/bin/env bash
# KV events on vs off: two dfkv_server side by side, warm 1 MiB PUT and GET, rounds alternate order.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd); B=$root/build; H=$root/docs/bench/kv-events; T=$(mktemp -d); rm -rf $T/off $T/on
$B/dfkv_server --port 0 --addr-file $T/off.addr --dir $T/off --cap 1GiB --max-msg 8MiB --metrics-port 0 >$T/off.log 2>&1 & P1=$!
$B/dfkv_server --port 0 --addr-file $T/on.addr --dir $T/on --cap 1GiB --max-msg 8MiB --kv-events tcp://127.0.0.1:25557 --kv-events-replay tcp://127.0.0.1:25558 --metrics-port 25590 >$T/on.log 2>&1 & P2=$!
trap 'kill $P1 $P2 $P3 $P4 $P5 2>/dev/null' EXIT
sleep 1; OFF=$(cat $T/off.addr); ON=$(cat $T/on.addr)
python3 $H/stall.py tcp://127.0.0.1:25557 600 & P3=$!   # a subscriber that never reads
python3 $H/churn.py $OFF 120 & P4=$!; python3 $H/churn.py $ON 120 & P5=$!   # tagged overwrites on both
for r in 1 2 3; do
  for op in put get; do
    order="off on"; [ $((r % 2)) = 0 ] && order="on off"
    for which in $order; do
      a=$OFF; [ $which = on ] && a=$ON
      nice -n 10 $B/dfkv_bench --target dfkv --members n1=$a --op $op --size 1MiB --keys 64 --conns 4 --warmup 1s --duration 3s --json --label "$which-$op-r$r" 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["label"], round(d["ops_per_s"],1), round(d["gb_per_s"],3), d["latency_us"]["p50"], d["errors"])'
    done
  done
done
curl -s 127.0.0.1:25590/metrics | grep -E '^dfkv_kv_events_(published|dropped|batches)_total'
