#!/usr/bin/env bash
# The test command: on a fresh Debian machine installs what is missing (Debian
# packages, the project venv with the pinned torch wheel), configures, builds
# with every core, and runs the whole suite through ctest. A second run
# installs nothing and builds incrementally.
#   tests/run.sh [ctest args...]     e.g. tests/run.sh -R equivalence
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=tests/deps.sh
source "$root/tests/deps.sh"
shardline_install_deps
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
cd build
# Tests labelled gpu skip themselves (exit code 77) where no GPU is present.
ctest --output-on-failure --timeout 900 "$@"
