#!/usr/bin/env bash
# A local Shardline cluster in one command: installs what is missing, builds,
# starts a coordinator and two CPU workers on loopback, trains a small
# character-level GPT with full_shard on English text from Debian's
# `fortunes` package (fetched now, nothing committed), follows it with the
# progress bar until it SUCCEEDED, and stops everything (also on Ctrl-C).
#
#   deploy/local/demo.sh [--steps N]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
steps=300
[ "${1:-}" = "--steps" ] && steps="${2:?--steps needs a number}"
cd "$root"
# shellcheck source=tests/deps.sh
source tests/deps.sh
shardline_install_deps
if [ ! -d /usr/share/games/fortunes ]; then
  echo "installing the fortunes package (the demo's English text)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fortunes >/dev/null
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target shardline-coordinator shardline-worker shardctl

work="$(mktemp -d /tmp/shardline-demo.XXXXXX)"
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "stopped the coordinator and workers; logs and state in $work"
}
trap cleanup EXIT
trap 'echo; echo interrupted; exit 130' INT TERM

# The corpus: every plain-text fortune file (not the .dat/.u8 indexes).
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8|*art*) ;; *) [ -f "$f" ] && cat "$f" ;; esac
done > "$work/corpus.txt"
echo "corpus: $(wc -c < "$work/corpus.txt") bytes of English text from Debian's fortunes package"

# Metrics on 9400 when it is free (what deploy/prometheus/prometheus-local.yml
# scrapes), else on any free port, as the coordinator prints; never a failure.
metrics_flag=()
[ -n "${SHARDLINE_METRICS_PORT:-}" ] && metrics_flag=(--metrics-port "$SHARDLINE_METRICS_PORT")
build/server/shardline-coordinator --listen 127.0.0.1:0 --state-dir "$work/state" "${metrics_flag[@]}" \
  > "$work/coordinator.out" 2> "$work/coordinator.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/coordinator.out" 2>/dev/null && break; sleep 0.1; done
addr="$(sed -n 's/^listening on //p' "$work/coordinator.out")"
[ -n "$addr" ] || { echo "the coordinator did not start: $(cat "$work/coordinator.log")"; exit 1; }
for _ in $(seq 20); do grep -q "metrics on port" "$work/coordinator.out" && break; sleep 0.1; done
metrics_port="$(sed -n 's/^metrics on port //p' "$work/coordinator.out")"
echo "coordinator on $addr; metrics on http://127.0.0.1:$metrics_port/metrics" \
  "(watch with: prometheus --config.file=deploy/prometheus/prometheus-local.yml, see the README)"
export SHARDLINE_COORDINATOR="$addr"
for i in 0 1; do
  build/worker/shardline-worker --coordinator "$addr" --device cpu --threads 1 --metrics-port 0 \
    > "$work/worker-$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  [ "$(build/client/shardctl workers 2>/dev/null | grep -c IDLE)" -ge 2 ] && break; sleep 0.1
done
build/client/shardctl workers

# The job is examples/tiny-gpt.toml (the file a user copies), at this run's steps.
sed -e "s/^steps = .*/steps = $steps/" -e 's/^name = .*/name = "fortunes-gpt"/' examples/tiny-gpt.toml \
  >"$work/fortunes-gpt.toml"
echo "submitting $work/fortunes-gpt.toml (full_shard over 2 workers, $steps steps)"
build/client/shardctl submit "$work/fortunes-gpt.toml" --follow
build/client/shardctl jobs
