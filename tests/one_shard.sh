# Sourced by the shell tests that run daemons against one shard. Needs
# $launch (launch_local), $server (ps_server) and $dir (the test's folder).
#
# short_run_config FLAGS...: runs a short launch_local run (one server, one
# epoch, FLAGS added) in $dir/run-N for its resolved config; sets config.
# start_server WORKERS LOG: starts a shard of $config for WORKERS workers on
# loopback, logging to LOG; sets server_pid and servers. The shard is killed
# when the test exits.

runs=0
short_run_config() {
  runs=$((runs + 1))
  local run="$dir/run-$runs"
  "$launch" --servers=1 --epochs=1 --hidden=8 --eval_interval_s=100 "$@" \
    --work_dir="$run" > "$run.log" 2>&1 || { cat "$run.log"; exit 1; }
  config="$run/config.textproto"
}

server_pid=
trap 'kill $server_pid 2>/dev/null || true' EXIT
start_server() {
  rm -f "$dir/port"
  "$server" --listen=127.0.0.1:0 --port_file="$dir/port" --config="$config" \
    --num_workers="$1" > "$2" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] || { cat "$2"; echo "no port file"; exit 1; }
  servers="127.0.0.1:$(cat "$dir/port")"
}
