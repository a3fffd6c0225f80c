# The RDMA suites over ibverbs on Soft-RoCE, inside the guest (tools/rdma-vm/suite.sh runs
# it). /host/bin holds the binaries and the prebuilt test binaries; results go to /out:
# one log per suite and /out/counts ("<suite> passed N failed N skipped N" lines). The
# status is non-zero when any suite failed or did not run.
#
# Fabric "l2": two veth pairs in the initial netns, rxe0 on dfkv0 (the default route) and
# rxe1 on dfkv1; each rail's traffic loops inside its own device, and taking one netdev
# down (the port-down test) leaves the other rail's carrier alone. The L2 suites run on
# rxe0, the two-rail tests on rxe0+rxe1.
set -u
say() { echo "rdma-suite: $*"; }
bin=/host/bin
status=0
: >/out/counts
. /host/.dfkv-vm/fabrics.sh # the fabrics below and wait_gid
say "step: versions"
uname -r | sed 's/^/  kernel /'
dpkg-query -W -f '  ${Package} ${Version}\n' rdma-core ibverbs-providers libibverbs1 2>/dev/null

say "step: fabric l2 (two veth pairs, rxe0/rxe1)"
modprobe rdma_rxe || { say "no rdma_rxe module"; exit 1; }
# udmabuf (built in or a module, depending on the kernel's config): the real DMA-BUF of
# TestRDMADirectDMABuf and the DMA-BUF probe; DFKV_TEST_REQUIRE_UDMABUF=1 (below) makes that
# test fail, not skip, without /dev/udmabuf.
[ -e /dev/udmabuf ] || modprobe udmabuf || say "no /dev/udmabuf and no udmabuf module (TestRDMADirectDMABuf will fail)"
ip link set lo up
for i in 0 1; do
  ip link add dfkv$i type veth peer name dfkv${i}p
  ip addr add 10.77.$i.1/24 dev dfkv$i
  ip addr add 10.77.$i.2/24 dev dfkv${i}p
  ip link set dfkv$i up
  ip link set dfkv${i}p up
  rdma link add rxe$i type rxe netdev dfkv$i
done
ip route add default via 10.77.0.2 dev dfkv0
for i in 0 1; do wait_gid - rxe$i 10.77.$i.1 dfkv$i dfkv${i}p || status=1; done
rdma link show
ibv_devices

# suite NAME BINARY ARGS...: runs one test binary with -test.v, keeps its log, counts.
suite() {
  name=$1 tb=$2
  shift 2
  say "step: suite $name ($(basename "$tb") $*)"
  t0=$(date +%s)
  "$tb" -test.v -test.count=1 "$@" >/out/$name.log 2>&1
  rc=$?
  p=$(grep -cE '^ *--- PASS' /out/$name.log)
  f=$(grep -cE '^ *--- FAIL' /out/$name.log)
  s=$(grep -cE '^ *--- SKIP' /out/$name.log)
  grep -E '^ *--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)\b|panic:' /out/$name.log | sed 's/^/  /'
  if [ $rc != 0 ]; then
    [ "$f" = 0 ] && f=1 # a panic or timeout fails the suite even with no --- FAIL line
    say "suite $name FAILED (status $rc); the end of its log:"
    tail -60 /out/$name.log | sed 's/^/  | /'
    status=1
  fi
  [ "$p" = 0 ] && [ $rc = 0 ] && { say "suite $name ran no test"; status=1; }
  echo "$name passed $p failed $f skipped $s seconds $(($(date +%s) - t0))" >>/out/counts
  rm -rf /tmp/Test* # a killed test leaves its data (in RAM) behind
}

ulimit -l unlimited
export DFKV_BIN_DIR=$bin DFKV_TEST_RDMA_PROVIDER=ibverbs DFKV_TEST_FABRIC_SCALE=${DFKV_TEST_FABRIC_SCALE:-10}
export DFKV_TEST_RDMA_DEV=rxe0 DFKV_TEST_RDMA_DEVS=rxe0,rxe1 DFKV_SOFTROCE=0 DFKV_TEST_CABI_DIR=$bin
export DFKV_TEST_REQUIRE_UDMABUF=1 # this kernel has udmabuf: its test must run here
cd /tmp
# DFKV_GUEST_SUITES: which parts run (default all).
want() { case " ${DFKV_GUEST_SUITES:-unit l2 cabi python bench routed twonic dmabuf} " in *" $1 "*) return 0 ;; esac; return 1; }
want dmabuf && probe_dmabuf
if want unit; then suite ibverbs-unit $bin/ibverbs.test -test.timeout 5m
  # On rxe as root nothing here may skip (TestABILayout needs the headers at build time).
  if grep -E '^ *--- SKIP' /out/ibverbs-unit.log; then
    say "suite ibverbs-unit skipped tests (above): it must run them all here"
    status=1
  fi
fi
want l2 && suite e2e-l2 $bin/e2e.test -test.timeout 14m -test.run "${DFKV_TEST_RUN:-^TestRDMA}" \
  -test.skip "${DFKV_TEST_SKIP:-^TestRDMASuiteOverIbverbs$}"
# DFKV_LOG=info: the C client's own lines (why RDMA fell back, rail breaks) in its log.
want cabi && DFKV_LOG=info suite cabi $bin/libdfkv.test -test.timeout 5m -test.run '^TestCProgram$'

# The Python binding (ctypes over the real libdfkv.so) with DFKV_RDMA_PROVIDER=ibverbs, and its
# DMA-BUF registration on a real udmabuf (python/tests/devmem.py; rxe refuses it: errno 95).
if want python; then
say "step: suite python (pytest python/tests/test_rdma.py test_dmabuf.py)"
t0=$(date +%s)
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/host/python DFKV_LIB=$bin/libdfkv.so DFKV_SERVER=$bin/dfkv_server \
  timeout 600 python3 -m pytest -p no:cacheprovider -v -rs /host/python/tests/test_rdma.py \
  /host/python/tests/test_dmabuf.py >/out/python.log 2>&1
rc=$?
tail -5 /out/python.log | sed 's/^/  /'
last=$(grep -E '(passed|failed|skipped|error)' /out/python.log | tail -1)
num() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
p=$(num passed) f=$(($(num failed) + $(num error))) sk=$(num skipped)
if [ $rc != 0 ] || [ "$p" = 0 ]; then
  [ "$f" = 0 ] && f=1
  say "suite python FAILED (status $rc)"
  tail -40 /out/python.log | sed 's/^/  | /'
  status=1
fi
echo "python passed $p failed $f skipped $sk seconds $(($(date +%s) - t0))" >>/out/counts
rm -rf /tmp/pytest-of-*
fi

# dfkv_bench over RDMA prints its table (a smoke run: the numbers under emulation mean nothing).
if want bench; then
say "step: suite bench (dfkv_bench --transport rdma --rdma-provider ibverbs)"
t0=$(date +%s)
mkdir -p /tmp/bench
$bin/dfkv_server --host 127.0.0.1 --port 0 --addr-file /tmp/bench/addr --dir /tmp/bench/data --cap 256MiB \
  --max-msg 8MiB --rdma --rdma-provider ibverbs --rdma-dev rxe0 --log-level warn >/out/bench-server.log 2>&1 &
spid=$!
for _ in $(seq 100); do [ -s /tmp/bench/addr ] && break; sleep 0.2; done
brc=1
if [ -s /tmp/bench/addr ]; then
  for op in put get; do
    timeout 120 $bin/dfkv_bench --node "$(cat /tmp/bench/addr)" --transport rdma --rdma-provider ibverbs \
      --op $op --size 1MiB --keys 32 --count 64 --conns 2 --warmup 0s --io-timeout 30s --verify >>/out/bench.log 2>&1
    brc=$?
    [ $brc = 0 ] || break
  done
fi
kill $spid 2>/dev/null; wait $spid 2>/dev/null
sed 's/^/  /' /out/bench.log
if [ $brc = 0 ]; then
  echo "bench passed 1 failed 0 skipped 0 seconds $(($(date +%s) - t0))" >>/out/counts
else
  say "suite bench FAILED (status $brc)"; tail -20 /out/bench-server.log | sed 's/^/  | /'
  echo "bench passed 0 failed 1 skipped 0 seconds $(($(date +%s) - t0))" >>/out/counts
  status=1
fi
fi
want routed && fabric_routed
want twonic && fabric_twonic

say "counts:"
sed 's/^/  /' /out/counts
exit $status
