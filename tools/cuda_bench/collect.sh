#!/usr/bin/env bash
# Builds the CUDA backend's test, the benchmark, the daemons and the two
# launchers with the CUDA backend (bazel build -c opt --config=cuda), then
# copies them (under bin/, laid out as in bazel-bin, so that the launchers
# find the daemons beside them), every shared library they load that a GPU
# machine may lack (lib/) and Fashion-MNIST (data/, where this machine has
# it) into one folder (default gpu-carry/, which .gitignore ignores) for
# gpu_check.sh to run there.
#
#   tools/cuda_bench/collect.sh [folder]
#   BAZEL="bazel --output_base=..." tools/cuda_bench/collect.sh
#
# Left out, as the GPU machine has its own: glibc's libraries, the C++ and
# GCC runtimes, and CUDA's (libcuda, libcudart, libcublas*), which the
# binaries find through their rpath or LD_LIBRARY_PATH at /usr/local/cuda.
set -euo pipefail
cd "$(dirname "$0")/../.."
BAZEL=${BAZEL:-bazel}
folder=${1:-gpu-carry}
binaries=(tests/cuda_backend_test tools/cuda_bench/backend_bench
  server/ps_server worker/ps_worker worker/ps_evaluator
  tools/launch_local tools/compare_modes)
targets=()
for b in "${binaries[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
data=/usr/share/datasets/fashion-mnist

$BAZEL build -c opt --config=cuda "${targets[@]}"
bin=$($BAZEL info -c opt --config=cuda bazel-bin 2>/dev/null)

rm -rf "$folder"
mkdir -p "$folder/lib"
for b in "${binaries[@]}"; do
  mkdir -p "$folder/bin/${b%/*}"
  cp -L "$bin/$b" "$folder/bin/$b"
  chmod u+w "$folder/bin/$b"
done
if [ -d "$data" ]; then
  mkdir -p "$folder/data"
  cp "$data"/*.gz "$folder/data/"
fi

for b in $(find "$folder/bin" -type f); do
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"; also catch "not found".
  if ldd "$b" | grep -q 'not found'; then
    echo "collect.sh: $b has libraries ldd cannot find:" >&2
    ldd "$b" | grep 'not found' >&2
    exit 1
  fi
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$name" in
    linux-vdso.so* | ld-linux*.so* | libc.so* | libm.so* | libpthread.so* | \
      libdl.so* | librt.so* | libresolv.so* | libutil.so* | \
      libstdc++.so* | libgcc_s.so* | \
      libcuda.so* | libcudart.so* | libcublas*.so*)
      continue ;;
  esac
  cp -L "$path" "$folder/lib/$name"
done

{
  echo "# Collected by tools/cuda_bench/collect.sh from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  (cd "$folder" && find bin lib data -type f -printf '%s\t%p\n' 2>/dev/null | sort -k2)
} > "$folder/MANIFEST"
total=$(du -sk "$folder" | cut -f1)
echo "collect.sh: $folder holds $(find "$folder/bin" -type f | wc -l) binaries and" \
  "$(ls "$folder/lib" | wc -l) libraries, ${total} KiB (a device call may" \
  "carry 64 MiB)"
if [ "$total" -gt $((60 * 1024)) ]; then
  # OpenBLAS alone is 36 MiB: carry bin/ and lib/ as one xz archive, which
  # gpu_check.sh unpacks.
  tar -C "$folder" -cJf "$folder/binlib.tar.xz" bin lib
  rm -rf "$folder/bin" "$folder/lib"
  total=$(du -sk "$folder" | cut -f1)
  echo "collect.sh: packed bin/ and lib/ into $folder/binlib.tar.xz; ${total} KiB"
  if [ "$total" -gt $((60 * 1024)) ]; then
    echo "collect.sh: too large to carry" >&2
    exit 1
  fi
fi
