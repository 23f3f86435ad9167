#!/usr/bin/env bash
# Installs what is needed, builds Monsoon, and compares the five update modes
# (sync, downpour, easgd, hogwild, onebit) and ring all-reduce (allreduce) on
# Fashion-MNIST: the default MLP,
# 2 servers and 2 workers on loopback, 3 epochs each, one mode after another.
# Prints the summary table and the paths of the plots at the end; about 3 to 4
# minutes on 2 cores. Extra arguments go to compare_modes (see its --help),
# e.g. ./tools/demo.sh --modes=downpour,onebit --workers=1,2,4
#
#   ./tools/demo.sh --scenario=straggler
#
# compares instead, with worker 1 three times slower (--straggler=1:3) and
# 3 seeds each: sync, sync with one backup worker, downpour, downpour with
# a staleness bound of 4, with the staleness-aware rate, and with delay
# compensation (0.04); the summary ends with each one's medians over the
# seeds. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=modes
args=()
for arg in "$@"; do
  case "$arg" in
    --scenario=*) scenario="${arg#--scenario=}" ;;
    *) args+=("$arg") ;;
  esac
done
case "$scenario" in
  modes | straggler) ;;
  *)
    echo "demo: unknown --scenario=$scenario (modes or straggler)" >&2
    exit 2
    ;;
esac
./tools/setup.sh
bazel build //tools:compare_modes
out=${MONSOON_DEMO_OUT:-/tmp/monsoon-demo}
if [ "$scenario" = straggler ]; then
  exec ./bazel-bin/tools/compare_modes --out_dir="$out-straggler" \
    --servers=2 --workers=2 --epochs=3 --straggler=1:3 --seeds=1,2,3 \
    --variants='sync;sync+backup_workers=1;downpour;downpour+max_staleness=4;downpour+staleness_lr=true;downpour+delay_compensation=0.04' \
    ${args[@]+"${args[@]}"}
fi
exec ./bazel-bin/tools/compare_modes --out_dir="$out" --servers=2 --workers=2 \
  --epochs=3 ${args[@]+"${args[@]}"}
