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

# A short run for its resolved config.
"$launch" --servers=1 --workers=1 --epochs=1 --hidden=8 --eval_interval_s=100 \
  --work_dir="$dir/run" > "$dir/launch.log" 2>&1 || { cat "$dir/launch.log"; exit 1; }
config="$dir/run/config.textproto"

server_pid=
trap 'kill $server_pid 2>/dev/null || true' EXIT
"$server" --listen=127.0.0.1:0 --port_file="$dir/port" --config="$config" \
  --num_workers=1 > "$dir/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || { cat "$dir/server.log"; echo "no port file"; exit 1; }
servers="127.0.0.1:$(cat "$dir/port")"

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
