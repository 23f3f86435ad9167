#!/usr/bin/env bash
# Installs what is needed, builds Monsoon, and trains the default MLP on
# Fashion-MNIST with a local cluster of 2 servers and 2 workers, once per
# mode, printing each run's metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
bazel build //tools:launch_local

out=${MONSOON_DEMO_OUT:-/tmp/monsoon-demo}
mkdir -p "$out"
modes=${MONSOON_DEMO_MODES:-sync downpour}
for mode in $modes; do
  echo "=== $mode: 2 servers, 2 workers, 3 epochs"
  ./bazel-bin/tools/launch_local --mode="$mode" --servers=2 --workers=2 \
    --epochs=3 --metrics_out="$out/$mode.json" > "$out/$mode.log" 2>&1 || {
      tail -n 40 "$out/$mode.log"; echo "demo: $mode failed (log: $out/$mode.log)"; exit 1; }
  grep -E '^\[(eval|worker [0-9]+)\].*(final|done:)' "$out/$mode.log" || true
done

echo
for mode in $modes; do
  echo "=== $mode metrics ($out/$mode.json, curve omitted)"
  sed '/"curve"/,$d' "$out/$mode.json"
done
echo "logs: $out/<mode>.log"
