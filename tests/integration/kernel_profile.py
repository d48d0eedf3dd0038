"""shardline-train --profile and bench/profile_summary.py.

The profile covers exactly the steps of its window: the tiny GPT's forward
runs the same ATen ops every step, so a window of two steps holds twice the
matmuls of a window of one, and a run that ends inside its window still writes
it. A window that is empty or starts at step 0 is refused, naming the flag.
The summary's arithmetic is checked on a made-up device trace whose busy time,
idle time, kinds and gaps are known: overlapping kernels count once."""
import json
import os
import subprocess
import sys

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import profile_summary  # noqa: E402


def matmuls(path):
    """The trace's aten::mm ops, each of which must carry its input shapes."""
    with open(path) as f:
        mms = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"]
    return len(mms) if all(len(e["args"].get("Input Dims", [])) == 2 for e in mms) else -1


def run_profiled(checks, window, steps=4):
    cfg = harness.config("no_shard", 1, train__steps=steps)
    trace = os.path.join(harness.scratch_dir("profile-"), "trace.json")
    harness.run(cfg, 1, extra_args=("--profile", trace, "--profile-steps", window))
    checks.check(os.path.exists(trace), f"--profile-steps {window} wrote its trace")
    return matmuls(trace) if os.path.exists(trace) else 0


def refused(window):
    cfg = harness.config("no_shard", 1, train__steps=2)
    path = os.path.join(harness.scratch_dir("profile-"), "job.toml")
    harness.write_toml(cfg, path)
    p = subprocess.run([harness.TRAIN, "--config", path, "--profile", path + ".json", "--profile-steps", window],
                       capture_output=True, text=True, timeout=60)
    return p.returncode != 0 and "--profile-steps" in p.stderr and not os.path.exists(path + ".json"), p.stderr


def summary_arithmetic(checks):
    # Two steps. Device: k1 [0, 100), k2 [50, 150) overlapping it, a copy
    # [400, 500), k3 [1000, 1100); host ops span [0, 2000). Busy = 150 + 100 +
    # 100 = 350 us over 2 steps; span 2000 us; gaps 250 (after k2) and 500.
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 2000,
         "args": {"External id": 7, "Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": [[8, 4], [4, 2]]}},
        {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_gemm", "ts": 0, "dur": 100, "args": {"External id": 7}},
        {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "ts": 50, "dur": 100},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 400, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 1000, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5},
    ]
    lines, f = profile_summary.summarize(ev, steps=2)
    checks.check(any("aten::mm(c10::BFloat16[8, 4], c10::BFloat16[4, 2])" in line for line in lines),
                 "profile_summary names the op that launched a kernel, with its input shapes")
    want = {"span_ms": 1.0, "busy_ms": 0.175, "idle_ms": 0.825, "kernels": 1.5, "launches": 0.5,
            "gaps_over_100us_ms": 0.375, "matmul_ms": 0.05, "elementwise_ms": 0.05, "copy/cast_ms": 0.05,
            "attention_ms": 0.05}
    bad = {k: (f.get(k), v) for k, v in want.items() if f.get(k) is None or abs(f[k] - v) > 1e-9}
    checks.check(not bad, "profile_summary: busy is the union of device intervals, idle the rest, kinds by name",
                 str(bad) if bad else "")


def main():
    checks = harness.Checks()
    one = run_profiled(checks, "1:2")
    two = run_profiled(checks, "1:3")
    checks.check(one > 0 and two == 2 * one,
                 "a window of two steps holds twice the matmuls of a window of one, with their shapes", f"{one} and {two}")
    ends_inside = run_profiled(checks, "2:9", steps=4)
    checks.check(ends_inside == 2 * one, "a job that ends inside its window writes the steps it ran",
                 f"{ends_inside} matmuls for steps 2-3")
    for window in ("0:2", "3:3", "2", "a:b"):
        ok, err = refused(window)
        checks.check(ok, f"--profile-steps {window} is refused, naming the flag", err.strip()[-160:])
    summary_arithmetic(checks)
    checks.finish()


if __name__ == "__main__":
    main()
