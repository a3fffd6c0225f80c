#!/bin/bash
# cabi_ab_x4.sh DFKV_ADDR DFKV_PID MC_ADDR MC_PID LIB_A LIB_B [ROUNDS]: two builds of libdfkv.so
# against memcached_py in tools/bench compare's x4 sequence (BENCHMARKS, "C ABI, part 4"):
# dfkv is re-seeded before each of its GET runs, a PUT phase of each system follows every
# round, and the order of the three GET runs rotates through all six permutations.
# Prints each round's GB/s and the ratio to memcached_py.
set -e
A=$1; P=$2; MA=$3; MP=$4; LA=$5; LB=$6; ROUNDS=${7:-12}
PY="python3 $(dirname "$0")/../../python/bench/cabi_compare.py"
drv() { # system addr pid op lib [--seed-only]
  DFKV_LIB=$5 $PY --system $1 --addr $2 --op $4 --mode scalar --threads 4 --size 1048576 --keys 384 \
    --seconds 2 --warmup 0.5 --ns ab4 --server-pid $3 $6 |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print("%.3f" % d.get("gb_per_s", 0))'
}
run() {
  case $1 in
  a) drv dfkv $A $P get $LA --seed-only >/dev/null; drv dfkv $A $P get $LA ;;
  b) drv dfkv $A $P get $LB --seed-only >/dev/null; drv dfkv $A $P get $LB ;;
  m) drv memcached_py $MA $MP get $LA ;;
  esac
}
drv memcached_py $MA $MP get $LA --seed-only >/dev/null
orders=("a m b" "b a m" "m b a" "a b m" "b m a" "m a b")
for r in $(seq $ROUNDS); do
  declare -A res
  ord=${orders[$(((r - 1) % 6))]}
  for s in $ord; do res[$s]=$(run $s); done
  drv dfkv $A $P put $LB >/dev/null
  drv memcached_py $MA $MP put $LA >/dev/null
  python3 -c "a,b,m=${res[a]},${res[b]},${res[m]}; print('order %s  A %.2f (%.2f)  B %.2f (%.2f)  memcached_py %.2f' % ('${ord// /}', a, a/m, b, b/m, m))"
done
