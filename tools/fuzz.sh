#!/usr/bin/env bash
# Builds Monsoon's libFuzzer targets (tests/fuzz/) with clang and runs each
# for SECONDS on a scratch copy of its seed corpus (tests/fuzz/corpus/<target>),
# as many targets at once as there are cores.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s, every target)
#   tools/fuzz.sh --write_seeds             (rewrites the seed corpora)
#
# Targets: push_decoder (float32 pushes), onebit_push (1-bit pushes), config
# (the config parser), checkpoint (the checkpoint reader). Each is built with
# AddressSanitizer and UndefinedBehaviorSanitizer; a crash, a sanitizer
# report or a broken invariant (the targets trap) fails the run, and the input
# that did it is kept in FUZZ_DIR/artifacts/<target>/ (printed). Prints the
# executions per target. Exits non-zero if any target failed.
#
# Built with clang++ directly rather than with a Bazel config: Bazel 4's
# auto-configured C++ toolchain is the gcc it found; clang through it takes
# --repo_env=CC=clang, which reconfigures the toolchain of the whole output
# base (every target rebuilt, and again on the way back to gcc), and the
# sanitizer --copts would share bazel-out/k8-opt with the normal build,
# evicting it; a clang cc_toolchain of our own is more machinery than these
# four binaries need. Protoc and the same system libraries as the Bazel
# build (Debian's gRPC, Protobuf and Abseil) are used; being built by gcc
# they are not instrumented, so coverage comes from Monsoon's own code,
# which is what is fuzzed. Needs clang and libfuzzer-14-dev (tools/setup.sh
# installs them).
#
# FUZZ_DIR (default: a new temporary folder, removed after a clean run) holds
# the build, the working corpora, the logs and the artifacts; the
# repository's corpora are only read. Reuse one to go on from the corpus a
# longer run grew, without rebuilding what has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
write_seeds=0
if [ "${1:-}" = "--write_seeds" ]; then
  write_seeds=1
  shift
fi
seconds=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(push_decoder onebit_push config checkpoint)
fi
for t in "${targets[@]}"; do
  case "$t" in
    push_decoder | onebit_push | config | checkpoint) ;;
    *) echo "fuzz: unknown target '$t' (push_decoder, onebit_push, config, checkpoint)" >&2
       exit 2 ;;
  esac
done
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz: SECONDS must be a positive whole number, got '$seconds'" >&2
  exit 2
fi
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "fuzz: clang++ not found (tools/setup.sh installs clang and libfuzzer-14-dev)" >&2
  exit 2
fi

if [ -n "${FUZZ_DIR:-}" ]; then
  dir=$FUZZ_DIR
  made_dir=0
else
  dir=$(mktemp -d -t monsoon-fuzz.XXXXXX)
  made_dir=1
  # Gone at the end unless a target fails (its inputs are kept).
  trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir/gen" "$dir/obj" "$dir/bin"
echo "fuzz: building in $dir" >&2

# Protobuf's generated code for the messages the targets read.
if [ ! -f "$dir/gen/proto/service.pb.cc" ] || [ -n "$(find proto -name \
     '*.proto' -newer "$dir/gen/proto/service.pb.cc" -print -quit)" ]; then
  protoc --cpp_out="$dir/gen" -I. proto/config.proto proto/service.proto \
    proto/checkpoint.proto proto/log.proto proto/sparse_table.proto
fi
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I. -I"$dir/gen"
       -fsanitize=address,undefined -fno-sanitize-recover=undefined)
sources=(common/config.cc common/config_resolve.cc common/log.cc
         common/model_config.cc common/sparse_table_config.cc
         common/data_shape.cc common/idx_reader.cc common/model_layout.cc
         common/onebit.cc common/wire.cc common/wire_reader.cc
         server/buffer_pool.cc server/checkpoint.cc
         server/optimizer.cc server/push_decoder.cc
         "$dir/gen/proto/config.pb.cc" "$dir/gen/proto/service.pb.cc"
         "$dir/gen/proto/checkpoint.pb.cc" "$dir/gen/proto/log.pb.cc"
         "$dir/gen/proto/sparse_table.pb.cc")
# Monsoon's sources get coverage instrumentation (fuzzer-no-link), compiled
# one per core at a time.
objects=()
pids=()
jobs=$(nproc 2>/dev/null || echo 2)
for src in "${sources[@]}"; do
  obj="$dir/obj/$(echo "$src" | tr '/' '_').o"
  # (Rebuilt when its source or any header is newer: a FUZZ_DIR reused.)
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find common server \
       proto "$dir/gen" -name '*.h' -newer "$obj" -print -quit)" ]; then
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  fi
  objects+=("$obj")
done
for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid"; done
absl=(absl_status absl_statusor absl_strings absl_str_format
      absl_synchronization absl_time absl_cord absl_hash absl_raw_hash_set
      absl_flags)
# shellcheck disable=SC2207  # pkg-config's words are the flags
libs=(-lgrpc++ -lgrpc -lgpr -lprotobuf -lz $(pkg-config --libs "${absl[@]}")
      -lpthread)

if [ "$write_seeds" -eq 1 ]; then
  # Valid and near-valid inputs, made with Monsoon's own writers.
  "$cxx" "${flags[@]}" tests/fuzz/make_seeds.cc "${objects[@]}" "${libs[@]}" \
    -o "$dir/bin/make_seeds"
  for t in push_decoder onebit_push config checkpoint; do
    mkdir -p "tests/fuzz/corpus/$t"
  done
  "$dir/bin/make_seeds" tests/fuzz/corpus
  echo "fuzz: seeds written under tests/fuzz/corpus/"
  exit 0
fi

build() {  # build NAME SOURCE [DEFINES...]
  local name=$1 src=$2
  shift 2
  "$cxx" "${flags[@]}" -fsanitize=fuzzer "$@" "$src" "${objects[@]}" \
    "${libs[@]}" -o "$dir/bin/$name"
}
build_target() {  # build_target TARGET
  case "$1" in
    push_decoder) build push_decoder tests/fuzz/push_decoder_fuzzer.cc ;;
    onebit_push)
      build onebit_push tests/fuzz/push_decoder_fuzzer.cc -DMONSOON_FUZZ_ONEBIT ;;
    config) build config tests/fuzz/config_fuzzer.cc ;;
    checkpoint) build checkpoint tests/fuzz/checkpoint_fuzzer.cc ;;
  esac
}
# Runs TARGET for SECONDS; its exit status goes to $dir/TARGET.rc.
run_target() {  # run_target TARGET
  local t=$1 rc
  local corpus="$dir/corpus/$t" artifacts="$dir/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  set +e
  ASAN_OPTIONS=allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$dir/bin/$t" -max_total_time="$seconds" -max_len=16384 \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts" "$corpus" > "$dir/$t.log" 2>&1
  rc=$?
  set -e
  echo "$rc" > "$dir/$t.rc"
}
# Each fuzzer is one process on one core: the targets are built, then run,
# as many at a time as there are cores (every target still gets SECONDS of
# a core to itself).
each_target() {  # each_target FUNCTION: FUNCTION TARGET for every target
  local f=$1 t pid status=0
  local running=()
  for t in "${targets[@]}"; do
    "$f" "$t" &
    running+=($!)
    if [ ${#running[@]} -ge "$jobs" ]; then
      wait "${running[0]}" || status=1
      running=("${running[@]:1}")
    fi
  done
  for pid in "${running[@]+"${running[@]}"}"; do wait "$pid" || status=1; done
  return "$status"
}
each_target build_target
each_target run_target

failed=0
for t in "${targets[@]}"; do
  log="$dir/$t.log"
  artifacts="$dir/artifacts/$t/"
  rc=$(cat "$dir/$t.rc")
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: clean, $runs executions in ${seconds} s"
  else
    failed=1
    trap - EXIT
    echo "fuzz: $t: FAILED (exit $rc) after $runs executions; log $log" >&2
    grep -E "ERROR|SUMMARY|runtime error|deadly signal" "$log" | head -5 >&2 || true
    for input in "$artifacts"*; do
      if [ -f "$input" ]; then
        echo "fuzz: $t: the input is kept in $input (reproduce: $dir/bin/$t $input)" >&2
      fi
    done
  fi
done
exit "$failed"
