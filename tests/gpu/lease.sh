#!/usr/bin/env bash
# One device call that does a lease's work (issue 22), in the order that keeps
# the most when time runs out: build and every gpu test, then GPT-2 350M
# against eager FSDP2 at global batch 8 with both sides profiled
# (bench/profile_summary.py's tables), then batch 16; at both batches also
# Shardline's full_shard on one rank, FSDP2's own semantics at world 1 (each
# unit's bf16 parameters and gradients freed after use; no_shard keeps them). Each part is a
# tests/gpu/run.sh step with its own budget, its logs tee'd as it runs; at the
# end everything goes to $OUT/logs.tgz (one file: a call returns at most 8) and
# the tables to stdout (a call returns the last 12,000 characters).
#
#   tests/gpu/lease.sh [MODELS]     MODELS for the profiled comparison (default gpt2-350m)
#
# Run it with .gpu-debs carried and timeout_s 590. The same steps, typed as
# one command, took 385 s on a fresh H200 (2026-11-28): build 72-80 s, the
# five tests 90 s, a comparison of 9 runs 186 s; this script has not run on
# a GPU yet.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 2
models="${1:-gpt2-350m}"
logs="$(mktemp -d /tmp/shardline-lease.XXXXXX)"
out="${OUT:-$logs}"

OUT="$logs/test" SHARDLINE_GPU_BUDGET=250 tests/gpu/run.sh test >"$logs/test-step.txt" 2>&1
echo "test step: exit $?"
grep -E '^(FAIL|\[  FAILED)' "$logs/test-step.txt" | head -20
head -12 "$logs/test/table-test.txt" 2>/dev/null

for batch in 8 16; do
  extra=(--keep-cheap-ops)
  [ "$batch" != 8 ] || extra=(--profile "$logs/prof")
  # Batch 8: two rounds and the profiled one (7 runs, ~150 s); batch 16: one round and Shardline
  # keeping its GELU and norm outputs ([memory] recompute_cheap_ops = false; 4 runs, ~100 s).
  OUT="$logs/bench-$batch" SHARDLINE_GPU_BUDGET=$((batch == 8 ? 200 : 140)) SHARDLINE_GPU_BENCH_TARGETS="" \
    tests/gpu/run.sh bench python3 bench/gpu_compare.py --models "$models" --batch "$batch" \
    --repeat $((batch == 8 ? 2 : 1)) --shared-worlds 1 --no-compile --budget $((batch == 8 ? 180 : 125)) \
    "${extra[@]}" \
    >"$logs/bench-$batch.txt" 2>&1
  echo "bench at batch $batch: exit $?"
  grep -E '^== profile|^span|^  by kind|^    [a-z/]+ +[0-9.]+ +[0-9.]+%$|^\|' "$logs/bench-$batch.txt" | tail -60
done

mkdir -p "$out"
if [ -d "$logs/prof" ]; then gzip -q "$logs"/prof/*.json || true; fi
tar czf "$out/logs.tgz" -C "$logs" . && echo "logs: $out/logs.tgz ($(du -h "$out/logs.tgz" | cut -f1))"
