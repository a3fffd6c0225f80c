#!/usr/bin/env bash
# The RDMA suites over the real verbs stack (rdma-core + the kernel's Soft-RoCE, rdma_rxe)
# in the Debian guest: builds the binaries and the Go test binaries on this machine, boots
# the guest (run.sh) with them on its read-only share, runs guest/rdma-suite.sh, prints the
# counts it brought back, and exits non-zero when anything failed or did not run.
#
#   tools/rdma-vm/suite.sh [--timeout S]     (default 1080 s in the guest)
#
# DFKV_TEST_RUN / DFKV_TEST_SKIP narrow the e2e tests (go test -run/-skip patterns).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
timeout=1080
[ "${1:-}" = --timeout ] && timeout=$2
step() { printf 'rdma-vm suite: %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }
t0=$(date +%s)
work=$root/build/rdma-vm
share=$work/share out=$work/out
rm -rf "$share"
mkdir -p "$share/bin"

# rdma-core's headers: the DMA-BUF probe links libibverbs, and ibverbs.test compares the
# provider's own declarations (verbs_abi.h) with <infiniband/verbs.h> (TestABILayout) only
# when they are here at build time; the guest suite fails if that test skipped.
if ! echo '#include <infiniband/verbs.h>' | gcc -E -x c - >/dev/null 2>&1; then
  echo "rdma-vm suite: rdma-core headers missing (apt-get install libibverbs-dev): TestABILayout and the DMA-BUF probe need them" >&2
  exit 1
fi

step "build (tools/build.sh)"
DFKV_BUILD_DIR=$share/bin tools/build.sh
step "test binaries (go test -c)"
go test -c -o "$share/bin/e2e.test" ./go/e2e
go test -c -o "$share/bin/ibverbs.test" ./go/internal/transport/rdma/verbs/ibverbs
go test -c -o "$share/bin/libdfkv.test" ./go/cmd/libdfkv
# The C ABI program (the guest has no compiler); it finds libdfkv.so beside itself.
gcc -std=c11 -Wall -Wextra -Werror -Igo/cmd/libdfkv -o "$share/bin/abi_test" go/cmd/libdfkv/testdata/abi_test.c \
  -L"$share/bin" -ldfkv '-Wl,-rpath,$ORIGIN' -pthread
gcc -std=c11 -Wall -Wextra -Werror -o "$share/bin/dmabuf_probe" "$here/probe/dmabuf_probe.c" -libverbs
mkdir -p "$share/python"
cp -r python/dfkv python/tests "$share/python/"
find "$share/python" -name __pycache__ -prune -exec rm -rf {} +
ls -la "$share/bin" | sed 's/^/  /'

step "guest"
rc=0
"$here/run.sh" --share "$share" --out "$out" --timeout "$timeout" "$here/guest/rdma-suite.sh" || rc=$?

step "counts (from the guest)"
if [ -s "$out/counts" ]; then
  sed 's/^/  /' "$out/counts"
  awk '{p+=$3; f+=$5; s+=$7} END {printf "  total passed %d failed %d skipped %d\n", p, f, s}' "$out/counts"
else
  echo "  none: the guest suite did not report (status $rc)"
  [ $rc = 0 ] && rc=1
fi
echo "rdma-vm suite: status $rc, $(($(date +%s) - t0)) s in all; logs in $out"
exit $rc
