#!/usr/bin/env bash
# Installs what is needed, builds Monsoon, and trains the default MLP on
# Fashion-MNIST with a local cluster of 2 servers and 2 workers, once in
# each mode (sync, downpour, easgd, hogwild, onebit), then prints a table
# of the runs' metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
bazel build //tools:launch_local

out=${MONSOON_DEMO_OUT:-/tmp/monsoon-demo}
mkdir -p "$out"
modes=${MONSOON_DEMO_MODES:-sync downpour easgd hogwild onebit}
for mode in $modes; do
  echo "=== $mode: 2 servers, 2 workers, 3 epochs"
  ./bazel-bin/tools/launch_local --mode="$mode" --servers=2 --workers=2 \
    --epochs=3 --metrics_out="$out/$mode.json" > "$out/$mode.log" 2>&1 || {
      tail -n 40 "$out/$mode.log"; echo "demo: $mode failed (log: $out/$mode.log)"; exit 1; }
  grep -E '^\[(eval|worker [0-9]+)\].*(final|done:)' "$out/$mode.log" || true
done

# One row per mode, read from the metrics files (one field per line).
field() { sed -n "s/^  \"$2\": \(.*\),\$/\1/p" "$1"; }
echo
printf '%-9s %9s %10s %8s %14s %14s %22s\n' mode accuracy samples/s wall_s bytes_pushed bytes_pulled "staleness mean/p99/max"
for mode in $modes; do
  f="$out/$mode.json"
  stale=$(sed -n 's/^  "staleness": {"mean": \([^,]*\), "p50": [0-9]*, "p99": \([0-9]*\), "max": \([0-9]*\)},$/\1\/\2\/\3/p' "$f")
  printf '%-9s %9s %10.0f %8.1f %14s %14s %22s\n' "$mode" \
    "$(field "$f" final_test_accuracy)" "$(field "$f" samples_per_s)" \
    "$(field "$f" wall_time_s)" "$(field "$f" bytes_pushed)" \
    "$(field "$f" bytes_pulled)" "$stale"
done
echo
echo "metrics (JSON, with the test-accuracy curve): $out/<mode>.json; logs: $out/<mode>.log"
