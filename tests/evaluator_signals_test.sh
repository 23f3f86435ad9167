#!/usr/bin/env bash
# ps_evaluator on a signal: SIGTERM (the end of a run) evaluates once more,
# its last point marked (final); SIGINT (a failed or interrupted run) stops
# at once, without it. Both exit 0.
set -euo pipefail
launch="$1"
server="$2"
evaluator="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}/evaluator_signals"
mkdir -p "$dir"
source "$(dirname "$0")/one_shard.sh"

short_run_config --workers=1
start_server 1 "$dir/server.log"

for signal in TERM INT; do
  log="$dir/eval-$signal.log"
  "$evaluator" --servers="$servers" --config="$config" --interval_s=0.1 \
    --device=cpu > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do grep -q '^.*INFO eval: ' "$log" && break; sleep 0.1; done
  grep -q 'INFO eval: ' "$log" || { cat "$log"; echo "no evaluation"; exit 1; }
  kill -"$signal" "$pid"
  status=0
  wait "$pid" || status=$?
  [ "$status" = 0 ] || { cat "$log"; echo "SIG$signal: exit $status"; exit 1; }
  if [ "$signal" = TERM ]; then
    grep -q 'INFO eval: .*(final)$' "$log" || {
      cat "$log"; echo "SIGTERM: no final evaluation"; exit 1; }
  else
    grep -q 'SIGINT: stopping without a last evaluation' "$log" || {
      cat "$log"; echo "SIGINT: not said"; exit 1; }
    if grep -q '(final)' "$log"; then
      cat "$log"; echo "SIGINT: a final evaluation"; exit 1
    fi
  fi
done
echo "evaluator_signals_test: ok"
