#!/usr/bin/env bash
# A worker started again after its rank finished (a pod or a launcher's
# restart of a worker killed as it finished) trains nothing, exits 0 and
# still writes its report, with no steps: a launcher reads one from every
# worker that exits 0.
set -euo pipefail
launch="$1"
server="$2"
worker="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}/finished"
mkdir -p "$dir"
source "$(dirname "$0")/one_shard.sh"

short_run_config --workers=1
start_server 1 "$dir/server.log"

"$worker" --rank=0 --num_workers=1 --servers="$servers" --config="$config" \
  --report_out="$dir/first.report" > "$dir/first.log" 2>&1 || {
  cat "$dir/first.log"; exit 1; }
grep -q '^outcome: "done"' "$dir/first.report" || { cat "$dir/first.report"; exit 1; }

"$worker" --rank=0 --num_workers=1 --servers="$servers" --config="$config" \
  --report_out="$dir/again.report" > "$dir/again.log" 2>&1 || {
  cat "$dir/again.log"; echo "the second start did not exit 0"; exit 1; }
grep -q "rank 0 has already finished its training; nothing to do" \
  "$dir/again.log" || { cat "$dir/again.log"; exit 1; }
[ -s "$dir/again.report" ] || { echo "no report from the second start"; exit 1; }
grep -q '^outcome: "done: the rank had already finished"' "$dir/again.report" || {
  cat "$dir/again.report"; exit 1; }
if grep -q '^steps:' "$dir/again.report"; then
  cat "$dir/again.report"; echo "the second start reports steps"; exit 1
fi

# An elastic run: a worker that joins once the data is all trained (a
# launcher's add as the run ends, a Kubernetes Job's later index) has
# nothing to train, exits 0 and writes a report of no steps too.
short_run_config --workers=1:2 --elastic
grep -q '^elastic: true' "$config" || { cat "$config"; exit 1; }
kill $server_pid 2>/dev/null || true
wait $server_pid 2>/dev/null || true
start_server 2 "$dir/elastic-server.log"
"$worker" --rank=0 --num_workers=2 --servers="$servers" --config="$config" \
  --report_out="$dir/elastic-first.report" > "$dir/elastic-first.log" 2>&1 || {
  cat "$dir/elastic-first.log"; exit 1; }
"$worker" --rank=1 --num_workers=2 --servers="$servers" --config="$config" \
  --report_out="$dir/late.report" > "$dir/late.log" 2>&1 || {
  cat "$dir/late.log"; echo "the late worker did not exit 0"; exit 1; }
grep -q "rank 1 has nothing left to train" "$dir/late.log" || {
  cat "$dir/late.log"; exit 1; }
grep -q '^outcome: "done: nothing left to train"' "$dir/late.report" || {
  cat "$dir/late.report"; echo "no report of no steps from the late worker"; exit 1; }
if grep -q '^steps:' "$dir/late.report"; then
  cat "$dir/late.report"; echo "the late worker reports steps"; exit 1
fi
echo "ps_worker_finished_test: a worker started after its rank finished, and one after an elastic run's data was trained, wrote reports of no steps"
