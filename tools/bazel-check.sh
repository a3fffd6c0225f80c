#!/usr/bin/env bash
# Staleness checks of the Bazel graph (CI runs this from tools/test.sh):
#   - every Go BUILD.bazel file is what gazelle generates (//:gazelle_diff);
#   - MODULE.bazel's use_repo(go_deps, ...) lists exactly the Go repositories BUILD files use.
# The FlatBuffers codegen check is a test (//schema:codegen_test, in `tools/bazel test //...`).
#
#   tools/bazel-check.sh          check; on failure prints the one command that fixes it
#   tools/bazel-check.sh --fix    regenerate: gazelle, then the use_repo list
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bz=tools/bazel
if [ "${1:-}" = "--fix" ]; then
  "$bz" run //:gazelle
  python3 bazel/sync_use_repo.py --fix "$root"
  echo "bazel-check: BUILD files and MODULE.bazel regenerated; review with git diff"
  exit 0
fi
rc=0
log=$(mktemp "${TMPDIR:-/tmp}/bazel-check.XXXXXX"); trap 'rm -f "$log"' EXIT
grc=0
diff=$("$bz" run --noshow_progress //:gazelle_diff 2>"$log") || grc=$?
# gazelle -mode=diff prints a unified diff for every BUILD file it would change.
if [ $grc -ne 0 ] && ! printf '%s' "$diff" | grep -q '^[-+@]'; then
  tail -30 "$log"
  echo "bazel-check: could not run //:gazelle_diff (exit $grc; output above)"
  exit 1
fi
if printf '%s' "$diff" | grep -q '^[-+@]'; then
  printf '%s\n' "$diff"
  echo "bazel-check: BUILD files are stale (gazelle would change them, above)"
  rc=1
fi
python3 bazel/sync_use_repo.py "$root" || rc=1
if [ $rc -ne 0 ]; then
  echo "bazel-check: FAIL. Fix with: tools/bazel-check.sh --fix   (runs tools/bazel run //:gazelle and updates use_repo in MODULE.bazel)"
  exit 1
fi
echo "bazel-check: BUILD files and MODULE.bazel use_repo are current"
