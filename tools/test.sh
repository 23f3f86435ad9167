#!/usr/bin/env bash
# Installs what is needed, then runs every test with Bazel, plus the
# concurrency tests under ThreadSanitizer. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
bazel test //... 2>&1 | tee "$log" || status=1
# The threaded units again under ThreadSanitizer (see .bazelrc).
bazel test --config=tsan //tests:tsan_tests 2>&1 | tee -a "$log" || status=1

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "${passed} passed, ${failed} failed"
exit "$status"
