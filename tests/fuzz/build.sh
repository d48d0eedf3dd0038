#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz/CMakeLists.txt: clang, libFuzzer,
# AddressSanitizer and UBSan) into BUILD_DIR, incrementally (Ninja).
#   tests/fuzz/build.sh [BUILD_DIR]      default: build/fuzz
# SHARDLINE_FUZZ_BUILD_JOBS: parallel compiles (default: every core).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/fuzz}"
for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || { echo "fuzz: $tool not found (tests/deps.sh installs it)" >&2; exit 1; }
done
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root/tests/fuzz" -B "$build" -G Ninja >/dev/null
fi
cmake --build "$build" -j "${SHARDLINE_FUZZ_BUILD_JOBS:-$(nproc)}"
