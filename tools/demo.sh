#!/usr/bin/env bash
# Installs what is needed, builds Monsoon, and compares the five update modes
# (sync, downpour, easgd, hogwild, onebit) on Fashion-MNIST: the default MLP,
# 2 servers and 2 workers on loopback, 3 epochs each, one mode after another.
# Prints the summary table and the paths of the plots at the end; about 3 to 4
# minutes on 2 cores. Extra arguments go to compare_modes (see its --help),
# e.g. ./tools/demo.sh --modes=downpour,onebit --workers=1,2,4
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
bazel build //tools:compare_modes
out=${MONSOON_DEMO_OUT:-/tmp/monsoon-demo}
exec ./bazel-bin/tools/compare_modes --out_dir="$out" --servers=2 --workers=2 \
  --epochs=3 "$@"
