#!/usr/bin/env bash
# The CUDA checks, run on a machine with a GPU from the repository root,
# with the folder that collect.sh filled (default gpu-carry/) carried there:
#   machine   nvidia-smi, and ldd of the binaries (nothing may be missing);
#   tests     the CUDA backend's tests against the CPU backend, where a skip
#             is a failure (MONSOON_REQUIRE_GPU=1);
#   bench     backend_bench on the GPU for the MLP and LeNet at batch 64,
#             256 and 1024 (with the square sgemm once), and on the CPU;
#   e2e       launch_local, sync, 2 shards and 2 workers, the same seed on
#             the GPU and on the CPU, for the MLP and LeNet: the final test
#             accuracies must agree within 0.01;
#   sanitizer where compute-sanitizer is installed: the tests again under
#             memcheck and, for the kernels with shared memory, racecheck;
#   compare   compare_modes, every mode, the MLP with 4 and 8 workers and
#             LeNet with 8 sharing the GPU, then the same on the CPU.
# GPU_CHECK_STAGES picks stages (default: all, in that order). Every step
# has a time limit (a step past it is a failure). Logs, reports and the
# comparisons' tables go to $OUT when it is set, else to ./gpu-check-out.
# Exits nonzero when a check failed.
#
#   tools/cuda_bench/gpu_check.sh [folder]
#   GPU_CHECK_STAGES="tests bench" tools/cuda_bench/gpu_check.sh
set -uo pipefail
folder=${1:-gpu-carry}
out=${OUT:-$PWD/gpu-check-out}
stages=" ${GPU_CHECK_STAGES:-machine tests bench e2e sanitizer compare} "
mkdir -p "$out"
if [ -f "$folder/binlib.tar.xz" ] && [ ! -d "$folder/bin" ]; then
  tar -C "$folder" -xJf "$folder/binlib.tar.xz" || exit 1
fi
export LD_LIBRARY_PATH="$PWD/$folder/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MONSOON_REQUIRE_GPU=1
bin="$PWD/$folder/bin"
data="$PWD/$folder/data"
test_bin="$bin/tests/cuda_backend_test"
bench_bin="$bin/tools/cuda_bench/backend_bench"
failed=()
start=$SECONDS

step() { echo; echo "=== $* ($((SECONDS - start)) s) ==="; }
want() { [[ "$stages" == *" $1 "* ]]; }

# check NAME LOG LIMIT_S COMMAND...: runs the command with its output in
# $out/LOG, shows the log's end, and records a failure under NAME.
check() {
  local name=$1 log=$2 limit=$3
  shift 3
  step "$name"
  timeout --kill-after=5 "$limit" "$@" > "$out/$log" 2>&1
  local status=$?
  tail -n 25 "$out/$log"
  if [ "$status" -ne 0 ]; then
    [ "$status" -eq 124 ] && echo "(stopped after its limit of $limit s)"
    echo "FAILED ($status): $name"
    failed+=("$name")
  fi
}

if want machine; then
  step "machine"
  { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv;
    nproc; } > "$out/machine.txt" 2>&1
  cat "$out/machine.txt"
  cat "$folder/MANIFEST" 2>/dev/null | head -3
  find "$bin" -type f -exec ldd {} + > "$out/ldd.txt" 2>&1
  if grep -q 'not found' "$out/ldd.txt"; then
    grep 'not found' "$out/ldd.txt"
    echo "FAILED: missing libraries"
    failed+=("ldd")
  fi
fi

if want tests; then
  check "cuda_backend_test" cuda_backend_test.log 180 \
    "$test_bin" --gtest_output="xml:$out/cuda_backend_test.xml"
fi

if want bench; then
  for model in mlp lenet; do
    for batch in 64 256 1024; do
      square=0
      [ "$model" = mlp ] && [ "$batch" = 64 ] && square=8192
      check "backend_bench --device=cuda --model=$model --batch=$batch" \
        "bench_cuda_${model}_${batch}.txt" 90 \
        "$bench_bin" --device=cuda --model=$model --batch=$batch --square=$square
    done
  done
  check "backend_bench --device=cpu --model=mlp" bench_cpu_mlp_64.txt 90 \
    "$bench_bin" --device=cpu --model=mlp --iterations=50 --square=2048
  check "backend_bench --device=cpu --model=lenet" bench_cpu_lenet_64.txt 90 \
    "$bench_bin" --device=cpu --model=lenet --iterations=50 --square=0
fi

# The final test accuracy in a launch_local metrics file.
accuracy() {
  sed -n 's/.*"final_test_accuracy": \([0-9.e+-]*\).*/\1/p' "$1" | head -1
}

if want e2e; then
  printf 'weight_decay: 0.0005\n' > "$out/lenet.textproto"
  for model in mlp lenet; do
    extra=(--epochs=3)
    [ "$model" = lenet ] && extra=(--epochs=3 --config="$out/lenet.textproto" --learning_rate=0.01)
    for device in cuda cpu; do
      check "launch_local sync $model --device=$device" "e2e_${model}_${device}.log" 150 \
        "$bin/tools/launch_local" --mode=sync --model=$model --servers=2 --workers=2 \
        --seed=1 --device=$device --data_dir="$data" --metrics_port=0 \
        --metrics_out="$out/e2e_${model}_${device}.json" "${extra[@]}"
    done
    gpu=$(accuracy "$out/e2e_${model}_cuda.json" 2>/dev/null)
    cpu=$(accuracy "$out/e2e_${model}_cpu.json" 2>/dev/null)
    step "accuracy $model: cuda ${gpu:-none}, cpu ${cpu:-none}"
    if [ -z "$gpu" ] || [ -z "$cpu" ] ||
        ! awk -v a="$gpu" -v b="$cpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }'; then
      echo "FAILED: $model's accuracies differ by more than 0.01 (or a run failed)"
      failed+=("accuracy $model")
    fi
  done
fi

if want sanitizer; then
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
  command -v compute-sanitizer > /dev/null 2>&1 && sanitizer=$(command -v compute-sanitizer)
  if [ -x "$sanitizer" ]; then
    # The two error-path tests fail on purpose (a refused cudaMalloc, a
    # refused sgemm), which the sanitizer would report; the slowest one
    # adds nothing the others do not cover.
    check "memcheck" memcheck.log 100 "$sanitizer" --tool memcheck --error-exitcode 3 \
      "$test_bin" \
      --gtest_filter='-*AnImpossibleAllocation*:*AFailedOperation*:*CopyToHostWaits*'
    check "racecheck" racecheck.log 80 "$sanitizer" --tool racecheck --error-exitcode 3 \
      "$test_bin" --gtest_filter='*ColumnSums*:*Softmax*:*OneBit*:*TrainingSteps*'
  else
    step "compute-sanitizer: not installed here, skipped"
  fi
fi

if want compare; then
  printf 'weight_decay: 0.0005\n' > "$out/lenet.textproto"
  for device in cuda cpu; do
    mkdir -p "$out/compare_mlp_$device" "$out/compare_lenet_$device"
    # Hogwild at the MLP's default rate (0.05) diverges with 8 workers on
    # the GPU, whose faster steps make each update staler.
    check "compare_modes --device=$device --model=mlp --workers=4,8" \
      "compare_mlp_$device.log" 200 \
      "$bin/tools/compare_modes" --device=$device --model=mlp --servers=2 \
      --variants='sync;downpour;easgd;hogwild+learning_rate=0.01;onebit' \
      --workers=4,8 --epochs=1 --data_dir="$data" --out_dir="$out/compare_mlp_$device" \
      --report_script="$PWD/tools/compare_report.py" --python="$(command -v python3)"
    check "compare_modes --device=$device --model=lenet --workers=8" \
      "compare_lenet_$device.log" 150 \
      "$bin/tools/compare_modes" --device=$device --model=lenet --servers=2 \
      --workers=8 --epochs=1 --config="$out/lenet.textproto" --learning_rate=0.01 \
      --data_dir="$data" --out_dir="$out/compare_lenet_$device" \
      --report_script="$PWD/tools/compare_report.py" --python="$(command -v python3)"
  done
fi

step "summary"
if [ "${#failed[@]}" -eq 0 ]; then
  echo "gpu_check: every check passed; logs in $out"
  exit 0
fi
echo "gpu_check: FAILED: ${failed[*]}; logs in $out"
exit 1
