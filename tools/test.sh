#!/usr/bin/env bash
# Installs what is needed, then runs every test with Bazel, plus the
# concurrency tests under ThreadSanitizer, the manifest checks, the
# container test (tools/k8s/container_test.sh) and the fuzz targets (20 s
# each). Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh || exit 1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
bazel test //... 2>&1 | tee "$log" || status=1
# The threaded units again under ThreadSanitizer (see .bazelrc).
bazel test --config=tsan //tests:tsan_tests 2>&1 | tee -a "$log" || status=1

# Offline checks of the Kubernetes manifests: render every overlay, type-check
# and schema-validate every object, and make sure broken fixtures fail.
# (tests/k8s_manifests_test, run above, runs the cpu-small overlay's pods.)
if ./tools/k8s/validate/check.sh 2>&1 | tee -a "$log"; then
  echo "//tools/k8s:validate PASSED" >> "$log"
else
  echo "//tools/k8s:validate FAILED" >> "$log"
  status=1
fi

# The container test: both images built from the binaries above, the
# cpu-small overlay's pods run as containers, the GPU image's worker without
# a GPU. Skips, saying why, where podman cannot run containers; prints its
# own PASSED/FAILED line.
./tools/k8s/container_test.sh 2>&1 | tee -a "$log" || status=1

# The libFuzzer targets, briefly (tools/fuzz.sh SECONDS runs them longer).
if ./tools/fuzz.sh 20 2>&1 | tee -a "$log"; then
  echo "//tools:fuzz PASSED" >> "$log"
else
  echo "//tools:fuzz FAILED" >> "$log"
  status=1
fi

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "${passed} passed, ${failed} failed"
exit "$status"
