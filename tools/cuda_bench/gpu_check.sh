#!/usr/bin/env bash
# The CUDA checks, run on a machine with a GPU from the repository root,
# with the folder that collect.sh filled (default gpu-carry/) carried there:
#   1. nvidia-smi, and ldd of the binaries (nothing may be missing);
#   2. the CUDA backend's tests against the CPU backend, where a skip is a
#      failure (MONSOON_REQUIRE_GPU=1);
#   3. where compute-sanitizer is installed: the tests again under memcheck
#      and, for the kernels with shared memory, racecheck;
#   4. the benchmark on the GPU (the default batch, then a large one), and
#      on the CPU for comparison.
# Logs and the benchmark reports go to $OUT when it is set, else to
# ./gpu-check-out. Exits nonzero when a check failed.
#
#   tools/cuda_bench/gpu_check.sh [folder]
set -uo pipefail
folder=${1:-gpu-carry}
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$folder/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MONSOON_REQUIRE_GPU=1
test_bin="$folder/bin/cuda_backend_test"
bench_bin="$folder/bin/backend_bench"
failed=()

step() { echo; echo "=== $* ==="; }

# Runs a command with its output in $out/<log> and on stdout; records a
# failure under <name>.
check() {
  local name=$1 log=$2
  shift 2
  step "$name"
  "$@" > "$out/$log" 2>&1
  local status=$?
  tail -n 40 "$out/$log"
  if [ "$status" -ne 0 ]; then
    echo "FAILED ($status): $name"
    failed+=("$name")
  fi
}

step "machine"
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } \
  > "$out/nvidia-smi.txt" 2>&1
cat "$out/nvidia-smi.txt"
cat "$folder/MANIFEST" 2>/dev/null

step "ldd"
ldd "$test_bin" "$bench_bin" > "$out/ldd.txt" 2>&1
cat "$out/ldd.txt"
if grep -q 'not found' "$out/ldd.txt"; then
  echo "FAILED: missing libraries"
  failed+=("ldd")
fi

check "cuda_backend_test" cuda_backend_test.log \
  "$test_bin" --gtest_output="xml:$out/cuda_backend_test.xml"

sanitizer=/usr/local/cuda/bin/compute-sanitizer
command -v compute-sanitizer > /dev/null 2>&1 && sanitizer=$(command -v compute-sanitizer)
if [ -x "$sanitizer" ]; then
  # The two error-path tests fail on purpose (a refused cudaMalloc, a
  # refused sgemm), which the sanitizer would report; the slowest one adds
  # nothing the others do not cover.
  check "memcheck" memcheck.log "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$test_bin" \
    --gtest_filter='-*AnImpossibleAllocation*:*AFailedOperation*:*CopyToHostWaits*'
  check "racecheck" racecheck.log "$sanitizer" --tool racecheck --error-exitcode 3 \
    "$test_bin" --gtest_filter='*ColumnSums*:*Softmax*:*OneBit*:*TrainingSteps*'
else
  step "compute-sanitizer: not installed here, skipped"
fi

check "backend_bench --device=cuda" bench_cuda.txt "$bench_bin" --device=cuda
check "backend_bench --device=cuda --batch=1024" bench_cuda_batch1024.txt \
  "$bench_bin" --device=cuda --batch=1024 --square=0
check "backend_bench --device=cpu" bench_cpu.txt \
  "$bench_bin" --device=cpu --iterations=50 --square=2048

step "summary"
if [ "${#failed[@]}" -eq 0 ]; then
  echo "gpu_check: every check passed; logs in $out"
  exit 0
fi
echo "gpu_check: FAILED: ${failed[*]}; logs in $out"
exit 1
