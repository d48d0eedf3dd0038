#!/usr/bin/env bash
# The GPU route on a GPU machine (NVIDIA driver, CUDA with nvcc, a python3
# whose torch is 2.11 with CUDA, CMake, ninja; no package registry), in steps
# that each fit one device call (10 minutes) and each end in a table:
#
#   tests/gpu/run.sh configure           unpack .gpu-debs/ into a private prefix and configure
#                                        (fails unless CUDA is built); also a dry run where apt works
#   tests/gpu/run.sh build               the same, then build the gpu tests' targets
#   tests/gpu/run.sh test [ctest args]   build if needed, run the tests labelled gpu; any skip fails
#                                        e.g. tests/gpu/run.sh test -R 'nccl_one_rank|gpu_engine_numerics'
#   tests/gpu/run.sh bench CMD [ARGS]    build if needed (with bench/'s programs), run CMD with
#                                        SHARDLINE_BUILD set, e.g. tests/gpu/run.sh bench python3 bench/x.py
#
# .gpu-debs/ comes from tests/gpu/fetch-debs.sh, run where apt works, and is
# carried with the tree. The prefix and the build live outside the tree (in
# /tmp) and survive between calls only while the machine stays warm (30 s
# after a call): run the steps back to back. A step on a fresh machine unpacks
# and rebuilds first, within its own time.
#
# Every step writes its logs (tee'd as they run, so a call stopped at its
# limit still leaves them) and its table to $OUT (else $build/logs), and
# stops its work at $SHARDLINE_GPU_BUDGET seconds (default 540) after it
# started so that the table is printed inside the device's 600 s.
#
# Environment: SHARDLINE_GPU_DEBS (.gpu-debs), SHARDLINE_DEPS_PREFIX (/tmp/shardline-deps),
# SHARDLINE_GPU_BUILD (/tmp/shardline-build-gpu), SHARDLINE_PYTHON (python3), SHARDLINE_GPU_BUDGET (540),
# SHARDLINE_GPU_CMAKE_ARGS (more configure arguments, split at spaces),
# SHARDLINE_GPU_BENCH_TARGETS (what bench builds beside the gpu targets; default
# "collective_bench checkpoint_bench"; empty for a CMD that runs shardline-train alone).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
t_start=$(date +%s)
step="${1:-}"
if [ $# -gt 0 ]; then shift; fi
debs="${SHARDLINE_GPU_DEBS:-$root/.gpu-debs}"
prefix="${SHARDLINE_DEPS_PREFIX:-/tmp/shardline-deps}"
build="${SHARDLINE_GPU_BUILD:-/tmp/shardline-build-gpu}"
python="$(command -v "${SHARDLINE_PYTHON:-python3}" || true)"
budget="${SHARDLINE_GPU_BUDGET:-540}"
lib="$prefix/usr/lib/x86_64-linux-gnu"
wrap="$prefix/wrap"
gpu_targets=(nccl_test shardline-train shardline-worker shardline-coordinator shardctl)
read -ra bench_targets <<<"${SHARDLINE_GPU_BENCH_TARGETS-collective_bench checkpoint_bench}"
rows=()   # the step's table: "what | seconds | result"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "$step" in configure | build | test | bench) ;; *) usage ;; esac
if [ -z "$python" ]; then echo "tests/gpu/run.sh: no ${SHARDLINE_PYTHON:-python3}" >&2; exit 2; fi
logs="${OUT:-$build/logs}"
mkdir -p "$logs"
now() { date +%s; }
left() { local l=$((budget - ($(now) - t_start))); echo $((l > 1 ? l : 1)); }
row() { rows+=("$1 | $2 | $3"); }

table() {
  {
    echo "== Shardline GPU $step: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')" \
      "$(date -u +%FT%TZ), $(($(now) - t_start)) s in all"
    echo "${gpu:-no GPU}"
    printf '%s\n' "${rows[@]}" | awk -F' [|] ' '{printf "%-24s %7s  %s\n", $1, $2, $3}'
    if [ -n "${1:-}" ]; then cat "$1"; fi
  } | tee "$logs/table-$step.txt"
}

# What the machine has: printed, kept in env.txt, and the GPU line heads every table.
facts() {
  gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
  {
    echo "python: $python"
    "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'devices', torch.cuda.device_count(), 'NCCL', '.'.join(map(str, torch.cuda.nccl.version())))" 2>&1 || true
    echo "nvidia-smi: ${gpu:-none}"
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none)"
    echo "cmake: $(cmake --version | head -1), ninja $(ninja --version 2>/dev/null || echo none), $(nproc) cores"
    echo "c++: $(c++ --version 2>/dev/null | head -1 || echo none)"
    echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null), glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
  } | tee "$logs/env.txt"
}

# The Debian packages into $prefix (never into /), once per set of .debs.
unpack() {
  local t0 stamp f data z
  t0=$(now)
  if [ ! -d "$debs" ] || ! compgen -G "$debs/*.deb" >/dev/null; then
    echo "tests/gpu/run.sh: $debs has no .deb: run tests/gpu/fetch-debs.sh where apt works, and carry .gpu-debs" >&2
    exit 2
  fi
  stamp="$({ find "$debs" -name '*.deb' -printf '%f %s\n' | sort; cat "$0"; } | cksum)"  # the debs and this script
  if [ "$(cat "$prefix/.stamp" 2>/dev/null)" = "$stamp" ]; then
    row unpack "$(($(now) - t0))" "$prefix as before"
    return
  fi
  rm -rf "$prefix" && mkdir -p "$prefix" "$wrap"
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix"
    else  # a .deb is an ar archive holding data.tar.xz (Debian 12)
      data="$(ar t "$f" | grep '^data\.tar')"
      case "$data" in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
      ar p "$f" "$data" | tar -x ${z:+"$z"} -f - -C "$prefix"
    fi
  done
  # The .pc files say prefix=/usr, and many (absl's, re2's) libdir=/usr/...
  # outright. pkgconf's --define-prefix would guess two folders up from
  # lib/x86_64-linux-gnu/pkgconfig, one short: say it plainly.
  find "$prefix" -name '*.pc' -exec sed -i -E "s#(=|-I|-L)/usr(/|\$)#\1$prefix/usr\2#g" {} +
  # Links to absolute paths (zlib1g-dev's libz.so -> /lib/.../libz.so.1.2.13)
  # point into the prefix.
  find "$prefix" -type l -lname '/*' | while read -r f; do
    if [ -e "$prefix$(readlink "$f")" ]; then ln -sfn "$prefix$(readlink "$f")" "$f"; fi
  done
  # protoc, grpc_cpp_plugin and pkgconf load the prefix's libraries; nothing
  # else (cmake, the compiler, python) runs with them on its path.
  for f in protoc grpc_cpp_plugin pkgconf; do
    # shellcheck disable=SC2016 # $LD_LIBRARY_PATH and $@ are the wrapper's, expanded when it runs
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
      "$lib" "$prefix/usr/bin/$f" >"$wrap/$f"
    chmod +x "$wrap/$f"
  done
  echo "$stamp" >"$prefix/.stamp"
  row unpack "$(($(now) - t0))" "$(find "$debs" -name '*.deb' | wc -l) debs into $prefix"
}

# Configures $build against the machine's torch and NCCL; fails unless CMake built CUDA.
configure() {
  local t0 rc nccl status extra
  read -ra extra <<<"${SHARDLINE_GPU_CMAKE_ARGS:-}"
  t0=$(now)
  command -v nvcc >/dev/null || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="/usr/local/cuda/bin:$PATH"
  nccl="$("$python" -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)"
  [ -z "$nccl" ] || export NCCL_HOME="$nccl"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
  unset PKG_CONFIG_PATH
  # Debian's headers come after the machine's own (-idirafter): they fill in
  # what the machine lacks (toml++, CLI11, gloo, OpenSSL) and never shadow its
  # libc. The programs carry the prefix in DT_RPATH (--disable-new-dtags), which,
  # unlike RUNPATH, also serves the libraries they load: no LD_LIBRARY_PATH.
  set +e
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLINE_PYTHON="$python" \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake" -DOPENSSL_ROOT_DIR="$prefix/usr" \
    -DPKG_CONFIG_EXECUTABLE="$wrap/pkgconf" -DProtobuf_PROTOC_EXECUTABLE="$wrap/protoc" \
    -DGRPC_CPP_PLUGIN="$wrap/grpc_cpp_plugin" \
    -DCMAKE_CXX_FLAGS="-idirafter $prefix/usr/include -idirafter $prefix/usr/include/x86_64-linux-gnu" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$lib -Wl,-rpath-link,$lib" \
    "${extra[@]}" 2>&1 | tee "$logs/configure.log"
  rc=${PIPESTATUS[0]}
  set -e
  status="$(grep -E '^-- CUDA: ' "$logs/configure.log" | tail -1 | sed 's/^-- //')"
  echo "${status:-CUDA: no status line}"
  if [ "$rc" != 0 ]; then
    row configure "$(($(now) - t0))" "FAILED (exit $rc): configure.log"
    grep -A8 'CMake Error' "$logs/configure.log" | head -40 >"$logs/errors.txt" || true
    table "$logs/errors.txt"
    exit 1
  fi
  if [[ "$status" != "CUDA: LibTorch CUDA"* ]]; then
    row configure "$(($(now) - t0))" "FAILED: ${status:-no CUDA status line}"
    grep -E '^(CUDAToolkit_NVCC_EXECUTABLE|CUDAToolkit_INCLUDE_DIR|NCCL_INCLUDE_DIR|NCCL_LIBRARY|SHARDLINE_CUDART):' \
      "$build/CMakeCache.txt" || true
    table
    exit 1
  fi
  row configure "$(($(now) - t0))" "$status"
}

# Builds the named targets within the step's budget (ninja resumes where it stopped).
compile() {
  local t0 rc
  t0=$(now)
  set +e
  timeout "$(left)" cmake --build "$build" -j"$(nproc)" --target "$@" 2>&1 | tee "$logs/build.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" = 124 ]; then
    row build "$(($(now) - t0))" "STOPPED at the step's budget: run the step again (ninja resumes)"
  elif [ "$rc" != 0 ]; then
    row build "$(($(now) - t0))" "FAILED (exit $rc): build.log"
  else
    row build "$(($(now) - t0))" "$*"
  fi
  if [ "$rc" != 0 ]; then
    grep -E -A3 '^FAILED: |error:' "$logs/build.log" | head -60 >"$logs/errors.txt" || true
    table "$logs/errors.txt"
    exit 1
  fi
}

# Each program finds every library it loads without LD_LIBRARY_PATH.
check_libraries() {
  local t0 p missing=""
  t0=$(now)
  command -v ldd >/dev/null || return 0
  for p in worker/shardline-train worker/shardline-worker server/shardline-coordinator client/shardctl tests/nccl_test; do
    if ldd "$build/$p" | grep -q 'not found'; then
      missing+=" $p:$(ldd "$build/$p" | awk '/not found/ {printf " %s", $1}')"
    fi
  done
  if [ -n "$missing" ]; then
    row libraries "$(($(now) - t0))" "NOT FOUND:$missing"
    table
    exit 1
  fi
  row libraries "$(($(now) - t0))" "every program's libraries found"
}

require_gpu() {
  if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    row device 0 "FAILED: torch sees no CUDA device (a GPU step on a machine without one)"
    table
    exit 1
  fi
}

prepare() {
  unpack
  configure
  compile "${gpu_targets[@]}" "$@"
  check_libraries
}

# ctest's result lines as table rows; the gpu tests it planned but never ran
# (the budget) as failures; skips as failures: on a GPU machine nothing skips.
run_tests() {
  local rc planned ran t n line skipped notrun="" summary
  summary="$logs/summary.txt"
  mapfile -t planned < <(cd "$build" && ctest -N -L gpu "$@" | sed -nE 's/^ *Test +#[0-9]+: (.*)$/\1/p')
  set +e
  (cd "$build" && ctest -L gpu --no-tests=error -V --timeout 300 \
    --stop-time "$(date -d "@$((t_start + budget))" +%H:%M:%S)" "$@") 2>&1 | tee "$logs/ctest.log"
  rc=${PIPESTATUS[0]}
  set -e
  ran="$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$logs/ctest.log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?(.*[^ ]) +([0-9.]+) sec.*/\1|\4|\3/')"
  n=0
  for t in "${planned[@]}"; do
    line="$(awk -F'|' -v t="$t" '$1 == t' <<<"$ran")"
    if [ -n "$line" ]; then
      row "${line%%|*}" "$(cut -d'|' -f2 <<<"$line")" "$(cut -d'|' -f3 <<<"$line")"
    else
      row "$t" - "NOT RUN (the step's budget): run it in the next call"
      notrun=1
    fi
    n=$((n + 1))
  done
  {
    # The harness's own lines (PASS/FAIL/NOTE), gtest's verdicts, the memory table.
    sed -E 's/^[0-9]+: //' "$logs/ctest.log" |
      grep -E '^(PASS|FAIL|NOTE|WORST) |^\[  (FAILED|SKIPPED) |^\[  PASSED  \]|^strategy |^(no_shard|zero1|shard_grad_op|full_shard|hybrid_shard)' || true
  } >"$summary"
  skipped="$(sed -E 's/^[0-9]+: //' "$logs/ctest.log" | grep -E '^\[  SKIPPED \] [A-Za-z]' | sort -u || true)"
  if grep -qE '\*\*\*Skipped|Not Run' "$logs/ctest.log" || [ -n "$skipped" ]; then
    {
      echo "SKIPPED on a GPU machine, which fails the step:"
      grep -E '\*\*\*Skipped|Not Run' "$logs/ctest.log" || true
      echo "$skipped"
    } >>"$summary"
    rc=1
  fi
  [ -z "$notrun" ] || rc=1
  row "gpu tests" "$(($(now) - t_start))" "$n planned, ctest exit $rc"
  table "$summary"
  return "$rc"
}

case "$step" in
  configure)
    facts
    unpack
    configure
    table
    ;;
  build)
    facts
    prepare
    table
    ;;
  test)
    facts
    require_gpu
    prepare
    run_tests "$@"
    ;;
  bench)
    [ $# -gt 0 ] || usage
    facts
    require_gpu
    prepare "${bench_targets[@]}"
    t0=$(now)
    set +e
    SHARDLINE_BUILD="$build" PYTHONUNBUFFERED=1 timeout "$(left)" "$@" 2>&1 | tee "$logs/bench.log"
    rc=${PIPESTATUS[0]}
    set -e
    row bench "$(($(now) - t0))" "$* (exit $rc$([ "$rc" = 124 ] && echo ': stopped at the budget'))"
    table
    exit "$rc"
    ;;
esac
