#!/usr/bin/env bash
# The GPU tests in one command, on a GPU machine: NVIDIA driver, CUDA (nvcc),
# a python3 whose torch is 2.11 with CUDA, CMake and ninja, no registry. The
# Debian packages the build needs travel with the tree in .gpu-debs/ (made
# on a development machine by tests/gpu/fetch-debs.sh). This unpacks them
# into a private prefix (never into /), builds into build-gpu/ on every
# core, runs every test labelled gpu and prints a table; with $OUT set it
# also leaves the log and the table there.
#   tests/gpu/run.sh [ctest args...]      e.g. tests/gpu/run.sh -R gpu_engine_numerics
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
prefix="${SHARDLINE_DEPS_PREFIX:-/tmp/shardline-deps}"
if [ ! -d .gpu-debs ] || ! ls .gpu-debs/*.deb >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: .gpu-debs/ is empty: run tests/gpu/fetch-debs.sh where apt works, and carry it" >&2
  exit 2
fi
mkdir -p "$prefix"
for f in .gpu-debs/*.deb; do dpkg-deb -x "$f" "$prefix"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
# The .pc files say prefix=/usr; pkgconf's --define-prefix would guess two
# folders up from lib/x86_64-linux-gnu/pkgconfig, one short. Say it plainly.
sed -i "s|^prefix=/usr\$|prefix=$prefix/usr|" "$lib"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc 2>/dev/null || true
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
python="$(command -v python3)"
"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'NCCL', torch.cuda.nccl.version())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
t0=$(date +%s)
# Debian's headers come after the machine's own (-idirafter): they fill in
# what the machine lacks (toml++, CLI11, gloo) and never shadow its libc.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDLINE_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake" -DOPENSSL_ROOT_DIR="$prefix/usr" \
  -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" \
  -DCMAKE_CXX_FLAGS="-idirafter $prefix/usr/include" >/dev/null
cmake --build build-gpu -j"$(nproc)"
t1=$(date +%s)
cd build-gpu
set +e
ctest -L gpu --output-on-failure --timeout 600 "$@" 2>&1 | tee ctest-gpu.log
rc=${PIPESTATUS[0]}
set -e
t2=$(date +%s)
{
  echo "== Shardline GPU tests: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ)"
  echo "build $((t1 - t0)) s, tests $((t2 - t1)) s"
  grep -E "^ *[0-9]+/[0-9]+ Test +#" ctest-gpu.log | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ \.+ */ | /'
  grep -hE "^(PASS|FAIL|NOTE|WORST) |^\[  (FAILED|PASSED|SKIPPED) |^strategy |^(no_shard|zero1|shard_grad_op|full_shard|hybrid_shard)" ctest-gpu.log || true
} | tee table.txt
if [ -n "${OUT:-}" ]; then cp ctest-gpu.log table.txt "$OUT"/; fi
exit "$rc"
