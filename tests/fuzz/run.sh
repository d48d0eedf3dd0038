#!/usr/bin/env bash
# Builds the fuzz targets (build.sh) and runs each for SECONDS (default 60)
# under AddressSanitizer and UBSan, starting from a copy of its seed corpus
# (tests/fuzz/corpus/<target>/, which is never grown here), then prints a table
# of executions, final coverage (libFuzzer's cov: edges, ft: features) and
# exit status. Exits non-zero if any target crashed, leaked, hung (-timeout)
# or ran out of memory; the input that did it is kept under
# BUILD_DIR/artifacts/<target>/ and named in the output.
#   tests/fuzz/run.sh [SECONDS] [TARGET...]
# SHARDLINE_FUZZ_BUILD: the build directory (default build/fuzz).
# SHARDLINE_FUZZ_JOBS: targets run at once (default 1).
# SHARDLINE_FUZZ_SEED: libFuzzer's -seed (default 1; 0 draws one). A fixed
#   seed makes the run in tests/run.sh explore the same inputs on every
#   machine, so a red run is one anybody can repeat; exploratory runs, longer
#   and with seed 0, are how new inputs are found (the closing notes list them).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(job_config safetensors manifest token_header hf_json dcp_metadata torch_saved_tensor)
build="${SHARDLINE_FUZZ_BUILD:-$root/build/fuzz}"
jobs="${SHARDLINE_FUZZ_JOBS:-1}"
seed="${SHARDLINE_FUZZ_SEED:-1}"

build_start=$SECONDS
"$root/tests/fuzz/build.sh" "$build"
echo "fuzz: built in $((SECONDS - build_start)) s; ${#targets[@]} targets x ${seconds} s, seed $seed"

# Largest input per target: a little over its largest real file.
declare -A max_len=([job_config]=4096 [safetensors]=4096 [manifest]=8192 [token_header]=2048 [hf_json]=4096
  [dcp_metadata]=8192 [torch_saved_tensor]=4096)
work="$(mktemp -d "${TMPDIR:-/tmp}/shardline-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/logs"

run_one() {
  local t="$1"
  local dict=() artifacts="$build/artifacts/$t/"
  mkdir -p "$work/$t" "$artifacts"
  cp -r "$root/tests/fuzz/corpus/$t/." "$work/$t/"
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  local rc=0
  "$build/${t}_fuzz" "$work/$t" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len="${max_len[$t]:-4096}" -print_final_stats=1 -seed="$seed" -artifact_prefix="$artifacts" \
    >"$build/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}

running=0
for t in "${targets[@]}"; do
  [ -x "$build/${t}_fuzz" ] || { echo "fuzz: no target $t" >&2; exit 2; }
  echo "fuzz: $t for ${seconds} s (log: $build/logs/$t.log)"
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
printf '\n%-14s %8s %12s %8s %8s %s\n' target seconds executions cov ft status
for t in "${targets[@]}"; do
  log="$build/logs/$t.log"
  rc="$(cat "$work/$t.rc")"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  time_s="$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)"
  stats="$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$stats")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$stats")"
  status=ok
  if [ "$rc" != 0 ]; then
    failed=1
    crash="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
    status="FAILED (exit $rc${crash:+; input: $crash}; log: $log)"
  fi
  printf '%-14s %8s %12s %8s %8s %s\n' "$t" "${time_s:--}" "${execs:--}" "${cov:--}" "${ft:--}" "$status"
done
if ((failed)); then
  echo
  for t in "${targets[@]}"; do
    [ "$(cat "$work/$t.rc")" = 0 ] && continue
    echo "---- $t: the end of $build/logs/$t.log"
    tail -40 "$build/logs/$t.log"
    # The input itself, so a CI log alone reproduces the failure.
    crash="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$build/logs/$t.log" | tail -1)"
    if [ -n "$crash" ] && [ -f "$crash" ]; then
      echo "---- $t: the input ($(stat -c %s "$crash") bytes, base64; first 4 KiB)"
      head -c 4096 "$crash" | base64
    fi
  done
  exit 1
fi
