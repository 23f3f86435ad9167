#!/usr/bin/env bash
# Builds Monsoon's two images with Podman and no registry: the CPU image
# (tools/Dockerfile) and the GPU image (tools/Dockerfile.gpu), then prints
# their sizes. Run from anywhere, as root (rootful Podman).
#
#   tools/k8s/images.sh [--tag=TAG] [--cpu-only | --gpu-only]
#                       [--prebuilt=DIR] [--prebuilt-gpu=DIR] [--cuda-image=IMAGE]
#
# What it does where no registry can be reached:
#   - The base image the Dockerfiles name, debian:bookworm, is made locally
#     once: `debootstrap --variant=minbase bookworm` from Debian's archive,
#     imported and tagged docker.io/library/debian:bookworm (kept in Podman's
#     storage, so later builds reuse it; --refresh-base makes it again).
#   - The GPU image's toolkit: unless --cuda-image=IMAGE names one (for
#     example NVIDIA's devel image, where a registry is reachable), an image
#     localhost/monsoon-cuda-toolkit:VERSION is made from the toolkit at
#     $CUDA_PATH or /usr/local/cuda (nvcc, its headers, cudart and cuBLAS),
#     and passed as the build argument CUDA_IMAGE.
#   - Builds run with --network=host, so that apt-get inside reaches
#     Debian's archive.
#
# By default both images build from source, as `docker build` would.
# --prebuilt=DIR puts the binaries in DIR (ps_server, ps_worker, ps_evaluator,
# run_finisher, health_probe, built on a Debian 12 machine) on the
# Dockerfile's runtime-base stage instead of building them in the image;
# --prebuilt-gpu=DIR likewise for the GPU image (the binaries of
# `bazel build --config=cuda`; the CUDA libraries they link are copied from
# the toolkit). tests/k8s_containers_test.py uses these to save CI the
# in-image build.
#
# Podman runs with --runtime=runc --cgroup-manager=cgroupfs and explicit
# ulimits, which also work on hosts whose cgroups crun refuses; PODMAN
# overrides the command (PODMAN="podman" for the defaults).
set -euo pipefail
cd "$(dirname "$0")/../.."

tag=0.14.0
cpu_only=0
gpu_only=0
refresh_base=0
prebuilt=""
prebuilt_gpu=""
cuda_image=""
cuda_path=${CUDA_PATH:-/usr/local/cuda}
for arg in "$@"; do
  case "$arg" in
    --tag=*) tag=${arg#*=} ;;
    --cpu-only) cpu_only=1 ;;
    --gpu-only) gpu_only=1 ;;
    --refresh-base) refresh_base=1 ;;
    --prebuilt=*) prebuilt=$(realpath "${arg#*=}") ;;
    --prebuilt-gpu=*) prebuilt_gpu=$(realpath "${arg#*=}") ;;
    --cuda-image=*) cuda_image=${arg#*=} ;;
    -h | --help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "images.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
read -r -a podman <<< "${PODMAN:-podman --runtime=runc --cgroup-manager=cgroupfs}"
base=docker.io/library/debian:bookworm
build=("${podman[@]}" build --network=host --ulimit=nofile=1024:1024
       --ulimit=nproc=4096:4096)

say() { echo "images.sh: $*" >&2; }

# 1. The Debian base.
if [ "$refresh_base" -eq 1 ] || ! "${podman[@]}" image exists "$base"; then
  command -v debootstrap >/dev/null ||
    { say "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
  rootfs=$(mktemp -d /var/tmp/monsoon-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  say "making $base with debootstrap (Debian's archive)"
  start=$SECONDS
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >&2
  # The archive the image's apt-get uses, as in Debian's own images.
  echo "deb http://deb.debian.org/debian bookworm main" > "$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "${podman[@]}" import \
    --change 'CMD ["bash"]' - "$base" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  say "made $base in $((SECONDS - start)) s"
else
  say "using $base from Podman's storage (--refresh-base makes it again)"
fi

# Binaries built outside: a context with DIR's binaries (and CUDA
# libraries), on the Dockerfile's runtime-base stage.
build_prebuilt() {  # dockerfile image bin_dir lib_dir
  local dockerfile=$1 image=$2 bin_dir=$3 lib_dir=$4 context
  "${build[@]}" --target=runtime-base -f "$dockerfile" \
    -t "localhost/${image%%:*}-runtime-base:$tag" . >&2
  context=$(mktemp -d)
  mkdir "$context/bin" "$context/lib"
  for b in ps_server ps_worker ps_evaluator run_finisher health_probe; do
    [ -x "$bin_dir/$b" ] || { say "$bin_dir/$b is missing"; exit 1; }
    cp -L "$bin_dir/$b" "$context/bin/"
  done
  local copy_lib=""
  if [ -n "$lib_dir" ]; then
    cp -L "$lib_dir"/* "$context/lib/"
    copy_lib="COPY lib/ /usr/local/cuda/lib64/"
  fi
  printf 'FROM localhost/%s-runtime-base:%s\n%s\nCOPY bin/ /usr/local/bin/\n' \
    "${image%%:*}" "$tag" "$copy_lib" > "$context/Containerfile"
  "${build[@]}" -f "$context/Containerfile" -t "$image" "$context" >&2
  rm -rf "$context"
}

# 2. The CPU image.
start=$SECONDS
if [ "$gpu_only" -eq 1 ]; then
  :
elif [ -n "$prebuilt" ]; then
  say "building monsoon:$tag from the binaries in $prebuilt"
  build_prebuilt tools/Dockerfile "monsoon:$tag" "$prebuilt" ""
else
  say "building monsoon:$tag from source (tools/Dockerfile)"
  nice -n 10 "${build[@]}" -f tools/Dockerfile -t "monsoon:$tag" . >&2
fi
[ "$gpu_only" -eq 1 ] || say "monsoon:$tag built in $((SECONDS - start)) s"

# 3. The GPU image.
if [ "$cpu_only" -eq 0 ]; then
  start=$SECONDS
  if [ -n "$prebuilt_gpu" ]; then
    libs=$(mktemp -d)
    # The CUDA libraries the worker links, as the Dockerfile picks them.
    ldd "$prebuilt_gpu/ps_worker" | awk '$1 ~ /^libcu/ && $3 ~ /^\// {print $3}' |
      xargs -r cp -L -t "$libs/"
    ls "$libs"/libcudart.so.* "$libs"/libcublas.so.* >/dev/null ||
      { say "$prebuilt_gpu/ps_worker does not link cudart and cuBLAS (built without --config=cuda?)"; exit 1; }
    say "building monsoon-gpu:$tag from the binaries in $prebuilt_gpu"
    build_prebuilt tools/Dockerfile.gpu "monsoon-gpu:$tag" "$prebuilt_gpu" "$libs"
    rm -rf "$libs"
  else
    if [ -z "$cuda_image" ]; then
      [ -x "$cuda_path/bin/nvcc" ] ||
        { say "no CUDA toolkit at $cuda_path (set CUDA_PATH, or give --cuda-image=IMAGE, or --cpu-only)"; exit 1; }
      real=$(realpath "$cuda_path")
      version=$(basename "$real" | sed -n 's/^cuda-//p')
      [ -n "$version" ] ||
        { say "$real is not named cuda-VERSION; cannot tell the toolkit's version"; exit 1; }
      cuda_image=localhost/monsoon-cuda-toolkit:$version
      if ! "${podman[@]}" image exists "$cuda_image"; then
        say "making $cuda_image from $real (nvcc, headers, cudart, cuBLAS)"
        # Only what the build needs: the compiler, the headers and the
        # libraries the backend links, at /usr/local/cuda-VERSION.
        (cd "$real/.." && tar -c \
          --exclude="$(basename "$real")/lib/*.a" \
          "$(basename "$real")/bin" "$(basename "$real")/include" \
          "$(basename "$real")/nvvm" "$(basename "$real")/lib64" \
          "$(basename "$real")"/lib/libcudart.so* \
          "$(basename "$real")"/lib/libcublas.so* \
          "$(basename "$real")"/lib/libcublasLt.so* \
          --transform 's,^,usr/local/,S') |
          "${podman[@]}" import - "$cuda_image" >/dev/null
      fi
      build_args=(--build-arg "CUDA_IMAGE=$cuda_image" --build-arg "CUDA_VERSION=$version")
    else
      build_args=(--build-arg "CUDA_IMAGE=$cuda_image")
    fi
    say "building monsoon-gpu:$tag from source (tools/Dockerfile.gpu, CUDA from $cuda_image)"
    nice -n 10 "${build[@]}" "${build_args[@]}" -f tools/Dockerfile.gpu \
      -t "monsoon-gpu:$tag" . >&2
  fi
  say "monsoon-gpu:$tag built in $((SECONDS - start)) s"
fi

# 4. Sizes.
"${podman[@]}" images --filter "reference=monsoon*:$tag" \
  --format '{{.Repository}}:{{.Tag}} {{.Size}}'
