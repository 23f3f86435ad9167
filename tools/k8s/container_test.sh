#!/usr/bin/env bash
# The container test: the cpu-small overlay's pods as real containers of the
# images the manifests name, and the gpu overlay's worker in the GPU image.
#
#   tools/k8s/container_test.sh
#
#   1. builds the daemons with Bazel (-c opt, then --config=cuda where a CUDA
#      toolkit is installed) and copies them aside;
#   2. builds monsoon:0.14.0 and monsoon-gpu:0.14.0 from those binaries
#      (tools/k8s/images.sh --prebuilt, on the Dockerfiles' runtime-base
#      stages: CI does not repeat the Bazel build inside the image; the
#      Debian base image is made once and kept in Podman's storage);
#   3. runs tests/k8s_manifests_test.py --containers --gpu_check: every pod
#      `podman run` on the host network, on its own 127.x address, with the
#      manifests' command, args, env and volumes; probes by `podman exec`;
#      the run ends by itself (every pod exits, metrics.json on the results
#      volume), shards checkpoint on SIGTERM; the GPU worker exits 2 saying
#      "no usable GPU" where there is none.
#
# Skips, exit 0 with the reason, where Podman cannot run a container here
# (not installed, not root, no runc) or kubectl or openssl is missing.
# Ends with "//tools/k8s:container_test PASSED" or "FAILED" (tools/test.sh
# counts it). BAZEL overrides the Bazel command.
set -uo pipefail
cd "$(dirname "$0")/../.."
BAZEL=${BAZEL:-bazel}
podman=(podman --runtime=runc --cgroup-manager=cgroupfs)

skip() {
  echo "k8s-containers: SKIPPED: $*"
  exit 0
}
fail() {
  echo "k8s-containers: $*"
  echo "//tools/k8s:container_test FAILED"
  exit 1
}

for tool in podman runc kubectl openssl debootstrap; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (tools/setup.sh installs it)"
done
[ "$(id -u)" -eq 0 ] ||
  skip "needs root: rootful Podman, and volumes given to the pods' fsGroup as the kubelet does"
"${podman[@]}" info >/dev/null 2>&1 ||
  skip "podman info fails here: $("${podman[@]}" info 2>&1 | tail -1)"

start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
targets=(//server:ps_server //worker:ps_worker //worker:ps_evaluator
         //tools/k8s:run_finisher //tools/k8s:health_probe)
binaries=(server/ps_server worker/ps_worker worker/ps_evaluator
          tools/k8s/run_finisher tools/k8s/health_probe)
collect() {  # DIR: the binaries Bazel just built, into DIR
  mkdir -p "$1"
  local bin
  bin=$($BAZEL info -c opt "${@:2}" bazel-bin 2>/dev/null) || return 1
  for b in "${binaries[@]}"; do cp -L "$bin/$b" "$1/" || return 1; done
}

nice -n 10 $BAZEL build -c opt "${targets[@]}" || fail "bazel build failed"
collect "$work/cpu" || fail "cannot copy the binaries"
images=(--prebuilt="$work/cpu")
gpu_check=()
cuda=${CUDA_PATH:-/usr/local/cuda}
if [ -x "$cuda/bin/nvcc" ]; then
  nice -n 10 $BAZEL build -c opt --config=cuda "${targets[@]}" ||
    fail "bazel build --config=cuda failed"
  collect "$work/gpu" --config=cuda || fail "cannot copy the CUDA binaries"
  images+=(--prebuilt-gpu="$work/gpu")
  gpu_check=(--gpu_check)
else
  images+=(--cpu-only)
  echo "k8s-containers: no CUDA toolkit at $cuda: the GPU image is not built or checked"
fi
echo "k8s-containers: binaries built in $((SECONDS - start)) s"

./tools/k8s/images.sh "${images[@]}" || fail "tools/k8s/images.sh failed"
echo "k8s-containers: images ready after $((SECONDS - start)) s"

if python3 tests/k8s_manifests_test.py --containers "${gpu_check[@]}" \
    --bin_dir="$work/cpu" --probe="$work/cpu/health_probe"; then
  echo "k8s-containers: done in $((SECONDS - start)) s"
  echo "//tools/k8s:container_test PASSED"
else
  fail "tests/k8s_manifests_test.py --containers failed"
fi
