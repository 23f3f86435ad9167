#!/usr/bin/env bash
# Installs, from Debian's packages, everything Monsoon's build, tests and demo
# need. Idempotent: does nothing when all of it is already installed.
#
#   tools/setup.sh               the build, the tests and the demo
#   tools/setup.sh --build-only  only what `bazel build` of the daemons needs
#                                (the images' build stage, tools/Dockerfile)
#
# Without --build-only it then builds the monsoon Python package's extension
# and installs the package for python3 (tools/install_python.sh), so that
# `import monsoon.torch` works.
set -euo pipefail

build_only=0
case "${1:-}" in
  --build-only) build_only=1 ;;
  "") ;;
  *) echo "usage: tools/setup.sh [--build-only]" >&2; exit 2 ;;
esac

packages=(
  g++
  bazel-bootstrap        # Bazel 4 (pulls in a JDK)
  bazel-rules-java       # @rules_java, declared locally in WORKSPACE
  libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  libopenblas-dev
  libgloo-dev            # mode allreduce's ring (gloo, as PyTorch's CPU backend)
  zlib1g-dev
  libssl-dev             # constant-time token comparison (libcrypto)
  prometheus-cpp-dev     # /metrics (prometheus-cpp: metric families, HTTP endpoint)
)
if [ "$build_only" -eq 0 ]; then
  packages+=(
  libgtest-dev libgmock-dev
  openssl                # tools/make_certs.sh
  prometheus             # tests/prometheus_test.py scrapes a local run
  clang libfuzzer-14-dev pkg-config  # tools/fuzz.sh (libFuzzer targets)
  llvm                   # llvm-symbolizer: sanitizer reports with file:line
  python3-dev pybind11-dev  # the monsoon Python package's extension (worker/python)
  python3-torch          # PyTorch scripts as workers, and their tests
  dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist
  python3 python3-matplotlib  # compare_modes' report and plots
  python3-yaml           # tests/k8s_manifests_test.py reads the rendered manifests
  iproute2               # compare_modes --link (ip, tc)
  # tests/k8s_containers_test.py and tools/k8s/images.sh: build the images
  # and run the manifests' pods as containers, with no registry.
  podman runc debootstrap
  )
  # Node and npm for tools/k8s/validate (any version from Node 14 on):
  # Debian's unless some are already on the PATH.
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    packages+=(nodejs npm)
  fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
install_python() {
  if [ "$build_only" -eq 0 ]; then
    "$(dirname "$0")/install_python.sh"
  fi
}
if [ ${#missing[@]} -eq 0 ]; then
  install_python
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
install_python
