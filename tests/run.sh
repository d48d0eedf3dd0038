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
# Two tests at a time: the unit and integration tests (a process, or up to 4
# ranks on loopback, each) overlap one another's start-up and waits; those
# that start services or whole clusters with deadlines (every e2e test, the
# deploy tests but gpu_route_carry_size, fuzz, plan_vs_engine) are RUN_SERIAL
# and run alone. Two, not nproc: that is how
# the suite is run on the 2-core machines it is kept green on, and more at
# once on few cores would stretch the integration tests' rank timeouts.
ctest --output-on-failure --timeout 900 --parallel 2 "$@"
