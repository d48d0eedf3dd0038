#!/usr/bin/env bash
# A GPU lease's work in two device calls, most valuable first. A lease is 15
# minutes of device time in all (every start, idle wait and call counted; a
# fresh machine takes a minute or more to start; one command runs at most 10
# minutes), so each call is capped well inside it and the two together leave
# time for one rerun:
#
#   tests/gpu/call.sh 1   at most 360 s (run it with timeout_s 360, .gpu-debs carried):
#                         build once; every gpu test but the Gloo one (nccl_one_rank,
#                         nccl_two_ranks, numerics, llama, nccl, memory, e2e: ctest's
#                         order); the seeds' workload (Qwen3-4B LoRA r=16, full_shard,
#                         bf16, T 1024, against PEFT) by bench/gpu_compare.py
#   tests/gpu/call.sh 2   at most 300 s (timeout_s 300; it builds first, 80 s on a fresh
#                         machine, where shared_gpu may then be left out): GPT-2 350M at batch 16 against eager FSDP2, Shardline
#                         with and without recompute_cheap_ops; one profiled pair at
#                         batch 8; gpu_engine_shared_gpu (Gloo ranks sharing the GPU) last
#
# Each step is a tests/gpu/run.sh step with its own cap (never past the call's
# budget, SHARDLINE_CALL_BUDGET), its output tee'd into $OUT/<step>.log as it
# runs, and ends in a row of $OUT/table.txt, rewritten after every step: a
# call cut short still returns what it did. run.sh's own files go to a
# scratch folder, packed into $OUT/logs.tgz at the end (a call returns at
# most 8 files). The step's tables print at the end (a call returns the last
# 12,000 characters of its output).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 2
call="${1:-}"
case "$call" in
  1) budget="${SHARDLINE_CALL_BUDGET:-345}" ;;
  2) budget="${SHARDLINE_CALL_BUDGET:-285}" ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
out="${OUT:-$(mktemp -d /tmp/shardline-call.XXXXXX)}"
scratch="$(mktemp -d /tmp/shardline-call-logs.XXXXXX)"
mkdir -p "$out"
t_start=$(date +%s)
rows=()
tables=()  # files whose contents close the call's output

left() { echo $((budget - ($(date +%s) - t_start))); }
capped() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }  # N seconds, or what the call has left

write_table() {
  {
    echo "== tests/gpu/call.sh $call: $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
      "$(date -u +%FT%TZ), $(($(date +%s) - t_start)) s of $budget"
    printf '%s\n' "${rows[@]}" | awk -F' [|] ' '{printf "%-14s %5s s  %s\n", $1, $2, $3}'
  } >"$out/table.txt"
}

# step NAME CAP CMD...: CMD with at most CAP seconds (less where the call's
# budget has less left), its output tee'd into $OUT/NAME.log; run.sh inside
# it gets the same figure less 10 s as its budget, so that it prints its own
# table before it is stopped.
step() {
  local name=$1 cap=$2 l t0 rc
  shift 2
  l=$(left)
  [ "$cap" -le "$l" ] || cap=$l
  if [ "$cap" -lt 30 ]; then
    rows+=("$name | 0 | NOT RUN: the call's budget was spent")
    write_table
    return
  fi
  t0=$(date +%s)
  OUT="$scratch/$name" SHARDLINE_GPU_BUDGET=$((cap - 10)) PYTHONUNBUFFERED=1 timeout -k 5 "$cap" "$@" 2>&1 |
    tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  rows+=("$name | $(($(date +%s) - t0)) | exit $rc$([ "$rc" = 124 ] && echo ' (stopped at its cap)'): $*")
  write_table
}

gpu_compare=(tests/gpu/run.sh bench python3 bench/gpu_compare.py --no-compile)

if [ "$call" = 1 ]; then
  # Build (80 s on a fresh H200) and the tests (about 150 s), then the seeds' workload.
  step tests 230 tests/gpu/run.sh test -E gpu_engine_shared_gpu
  tables+=("$scratch/tests/table-test.txt")
  # PEFT eager, Shardline full_shard, PEFT under FSDP2: one run each of 8
  # steps; no run starts past its --budget, and each run stops there.
  SHARDLINE_GPU_BENCH_TARGETS="" step seeds 150 "${gpu_compare[@]}" --models qwen3-4b-lora16 --batch 8 --steps 8 \
    --repeat 1 --shared-worlds "" --budget $(($(capped 150) - 20)) --table "$out/seeds-table.md"
  tables+=("$out/seeds-table.md")
else
  # Batch 16: Shardline no_shard and full_shard at N=1, and keeping the cheap
  # ops, against eager FSDP2, the pair twice (about 25 s a run).
  # A few seconds where call 1's build is still there; 80 s on a fresh machine.
  SHARDLINE_GPU_BENCH_TARGETS="" step build 100 tests/gpu/run.sh build
  SHARDLINE_GPU_BENCH_TARGETS="" step gpt2-b16 120 "${gpu_compare[@]}" --models gpt2-350m --batch 16 --repeat 2 \
    --shared-worlds 1 --keep-cheap-ops --budget $(($(capped 120) - 20)) --table "$out/gpt2-b16.md"
  tables+=("$out/gpt2-b16.md")
  # One profiled pair at batch 8 (no table rows: where each side's step goes).
  SHARDLINE_GPU_BENCH_TARGETS="" step profile 60 "${gpu_compare[@]}" --models gpt2-350m --batch 8 --repeat 0 \
    --shared-worlds "" --profile "$scratch/prof" --budget $(($(capped 60) - 15))
  step shared-gpu 75 tests/gpu/run.sh test -R gpu_engine_shared_gpu
  tables+=("$scratch/shared-gpu/table-test.txt")
fi

if [ -d "$scratch/prof" ]; then gzip -q "$scratch"/prof/*.json 2>/dev/null || true; fi
tar czf "$out/logs.tgz" -C "$scratch" . 2>/dev/null
echo
for f in "${tables[@]}"; do [ -f "$f" ] && { echo "== $f"; grep -vE '^ *$' "$f" | tail -40; }; done
cat "$out/table.txt"
