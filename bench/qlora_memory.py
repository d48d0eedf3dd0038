"""The seeds' workload at full size on CPU workers: Qwen3-4B's shape (36 x
2560, GQA 32:8, SwiGLU 9728, vocabulary 151,936, tied, q/k norms), LoRA rank
16 on every projection, full_shard at N = 2, bf16, activation checkpointing,
one sequence a rank, the base from the seed (no weights to read), with the
frozen base in bf16 (`param_dtype`) and in NF4 (QLoRA), alternated within
each repeat.

Columns (medians of --repeats runs, [min-max] where they vary):
    peak_rss    the larger rank's peak RSS (VmHWM), GiB
    plan        `shardctl plan --device cpu`'s full_shard peak per rank with
                checkpointing for the same job, its reserve included (what the
                process holds beyond its tensors), GiB, and peak_rss's error
                against it
    plan_live   the plan's peak of live tensors alone, GiB
    tensors     the larger rank's peak of live tensor bytes (LibTorch's CPU
                allocations), GiB: what plan_live predicts
    reserved    the larger rank's peak of bytes held for them (malloc's and
                the host block cache's mappings, live and cached), GiB
    base        the engine's ledger: the frozen base's bytes a rank keeps
                (its shard, and for NF4 the replicated scales), GiB
    gathered    bytes a rank sent in all-gathers over the timed steps, per
                step, GiB
    tok/s       over the timed steps (the first step is a warm-up)
The goal lines after the table: NF4's base bytes and gathered bytes as
fractions of bf16's, and each run's peak RSS within 5% of its plan.

    .venv/bin/python bench/qlora_memory.py [--repeats 3] [--seq 16] [--steps 2] [--layers 36]
        [--bases param_dtype,nf4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import harness  # noqa: E402
from harness import spread  # noqa: E402
from gpu_compare import QWEN3  # noqa: E402

WORLD = 2
SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
GIB = float(1 << 30)


def job_config(a, base_dtype):
    cfg = harness.config("full_shard", WORLD, micro_batches=1, train__steps=a.steps)
    cfg["model"] = dict(QWEN3["qwen3-4b"], block_size=a.seq, n_layer=a.layers)
    cfg["train"]["batch_size"] = WORLD
    cfg["train"]["micro_batch_size"] = 1
    cfg["precision"] = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    cfg["memory"]["activation_checkpointing"] = True
    cfg["lora"] = {"rank": 16, "alpha": 32, "target_modules": "all-linear", "base_dtype": base_dtype}
    return cfg


def planned_peak(cfg):
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job.toml")
        harness.write_toml(cfg, job)
        r = subprocess.run([SHARDCTL, "--json", "plan", job, "--workers", str(WORLD), "--device", "cpu"],
                           capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise harness.RunError(f"shardctl plan: {r.stderr.strip()}")
    full = next(s for s in json.loads(r.stdout)["strategies"] if s["strategy"] == "full_shard")
    return full["peak_bytes_checkpointed"], full["reserve_bytes_checkpointed"]


def measure(a, base_dtype):
    cfg = job_config(a, base_dtype)
    live, reserve = planned_peak(cfg)
    _, ranks = harness.run(cfg, WORLD, timeout=3600)
    timed = ranks[0]["steps"][1:]
    steps = len(ranks[0]["steps"])
    return {
        "peak_rss": max(r["memory"]["peak_rss"] for r in ranks) / GIB,
        "plan": (live + reserve) / GIB,
        "plan_live": live / GIB,
        "tensors": max(r["memory"]["tensor_peak"] for r in ranks) / GIB,
        "reserved": max(r["memory"]["reserved_peak"] for r in ranks) / GIB,
        "base": max(r["memory"]["params"] for r in ranks) / GIB,
        "gathered": max(r["comm"]["shard"]["all_gather"]["bytes"] for r in ranks) / steps / GIB,
        "tok/s": statistics.median(s["tokens_per_s"] for s in timed),  # the global batch's tokens
        "loss": ranks[0]["steps"][-1]["loss"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=36, help="fewer blocks of the same width: the load's peak "
                    "(the vocabulary table) stands alone")
    ap.add_argument("--bases", default="param_dtype,nf4")
    a = ap.parse_args()
    bases = tuple(a.bases.split(","))
    runs = {b: [] for b in bases}
    for i in range(a.repeats):
        for b in bases if i % 2 == 0 else reversed(bases):
            runs[b].append(measure(a, b))
            print(f"# repeat {i + 1} {b}: {json.dumps(runs[b][-1])}", flush=True)
    print(f"# qlora_memory: Qwen3-4B's shape ({a.layers} blocks) at sequence {a.seq}, LoRA r16 all-linear, full_shard N={WORLD}, bf16, "
          f"activation checkpointing, {a.steps - 1} timed step(s) after 1, {a.repeats} repeats, {os.cpu_count()} cores")
    cols = ("peak_rss", "plan", "plan_live", "tensors", "reserved", "base", "gathered", "tok/s")
    print(f"{'base':<12}" + "".join(f"{c:>22}" for c in cols) + f"{'err':>8}")
    for b in bases:
        rs = runs[b]
        err = statistics.median((r["peak_rss"] - r["plan"]) / r["plan"] for r in rs)
        print(f"{b:<12}" + "".join(f"{spread([r[c] for r in rs], '{:.3f}' if c != 'tok/s' else '{:.1f}'):>22}"
                                   for c in cols) + f"{err:>+8.1%}")
    med = {b: {c: statistics.median(r[c] for r in runs[b]) for c in cols} for b in bases}
    if len(bases) == 2:
        print(f"goal: NF4 base {med['nf4']['base'] / med['param_dtype']['base']:.3f}x bf16's (about a quarter), "
              f"gathered {med['nf4']['gathered'] / med['param_dtype']['gathered']:.3f}x (about 0.27x), "
              f"tok/s {med['nf4']['tok/s'] / med['param_dtype']['tok/s']:.2f}x")
    worst = max(abs(r["peak_rss"] - r["plan"]) / r["plan"] for b in bases for r in runs[b])
    print(f"goal: every run's peak RSS within 5% of its plan: worst {worst:+.1%} ({'met' if worst <= 0.05 else 'not met'})")


if __name__ == "__main__":
    main()
