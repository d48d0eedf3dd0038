"""Gradient memory under gradient accumulation (issue 26): the small GPT
under full_shard at N = 2 with 1, 4 and 16 micro-batches per rank, in both
[train] grad_accumulation modes. Sharded keeps a rank's gradients near 1/N
of the model whatever the micro-batch count; unsharded holds every unit's
whole gradient across micro-batches.

Columns (medians of --repeats runs, [min-max] where they vary):
    peak_grads   the engine's ledger: the most gradient bytes a rank held
    whole        the model's gradient in reduce_dtype (fp32), for scale
    tensors      the largest rank's peak of live tensor bytes (every CPU
                 tensor LibTorch allocated, activations and temporaries
                 included): what peak RSS would be above the program's
                 own, with an allocator that returned every freed byte
    plan         `shardctl plan`'s peak bytes per rank for the same job
                 (what it predicts a device holds), and its error against
                 tensors
    peak_rss     the largest rank's peak RSS (VmHWM)
    tok/s        over the timed steps (the first is a warm-up)
    rs_bytes     reduce-scatter bytes a rank sent per step

Self-checking (a failed check exits 1):
- sharded: peak_grads at m micro-batches is at most its figure at one
  micro-batch plus the largest unit's shard (the scratch shard a later
  micro-batch is reduce-scattered into before it is added);
- unsharded, m > 1: peak_grads holds at least the whole gradient (every
  unit's, kept across micro-batches).
Sharded is not below the whole gradient at N = 2: the gradient shard is
half of it, and the tied embedding's unsharded gradient (a third of this
GPT) lives from the head's backward to the embedding's.

Allocators (--allocators): `cache`, the engine's (TensorMemory serves
large tensors from a HostBlockCache), and `malloc` (every tensor from
glibc's malloc, SHARDLINE_HOST_BLOCK_CACHE=0), run in turn within each
repeat. The goal lines after the table: sharded peak RSS flat within 5% from
the fewest to the most micro-batches; unsharded growing by about the
gradients it holds (its peak_grads over sharded's).

    .venv/bin/python bench/accumulation_memory.py [--micro 1,4,16] [--repeats 3] [--seq 64]
        [--allocators cache,malloc]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import harness  # noqa: E402
from harness import spread  # noqa: E402

WORLD = 2
SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")


def job_config(a, micro, mode):
    cfg = harness.small_gpt_config("full_shard", WORLD, a.steps, WORLD * micro)
    cfg["model"]["block_size"] = a.seq
    cfg["train"]["micro_batch_size"] = 1
    cfg["train"]["grad_accumulation"] = mode
    return cfg


def planned_peak(a, micro, mode):
    """`shardctl plan`'s peak tensor bytes per rank for full_shard."""
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job.toml")
        harness.write_toml(job_config(a, micro, mode), job)
        r = subprocess.run([SHARDCTL, "--json", "plan", job, "--workers", str(WORLD)], capture_output=True,
                           text=True, timeout=60)
    if r.returncode != 0:
        raise harness.RunError(f"shardctl plan: {r.stderr.strip()}")
    return next(s for s in json.loads(r.stdout)["strategies"] if s["strategy"] == "full_shard")["peak_bytes"]


def run_once(a, allocator, micro, mode):
    """One job of the small GPT; its largest rank's figures."""
    cfg = job_config(a, micro, mode)
    os.environ["SHARDLINE_HOST_BLOCK_CACHE"] = "1" if allocator == "cache" else "0"  # the ranks inherit it
    try:
        _, ranks = harness.run(cfg, WORLD, timeout=1800, threads=1)
    finally:
        del os.environ["SHARDLINE_HOST_BLOCK_CACHE"]
    timed = ranks[0]["steps"][1:]
    return {"grads": max(r["memory"]["peak_grads"] for r in ranks),
            "tensors": max(r["memory"]["tensor_peak"] for r in ranks),
            "rss": max(r["memory"]["peak_rss"] for r in ranks),
            "tps": WORLD * micro * a.seq / (sum(s["seconds"] for s in timed) / len(timed)),
            "rs": ranks[0]["comm"]["shard"]["reduce_scatter"]["bytes"] / a.steps,
            "whole": sum(u["padded"] for u in ranks[0]["units"]) * 4,
            "scratch": max(u["shard"] for u in ranks[0]["units"]) * 4}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--allocators", default="cache,malloc")
    a = ap.parse_args()
    allocators = a.allocators.split(",")
    if any(x not in ("cache", "malloc") for x in allocators):
        ap.error("--allocators: cache and/or malloc")
    mib = 1 << 20
    print(f"# accumulation_memory: small GPT {harness.SMALL_GPT} at block {a.seq}, full_shard N={WORLD}, "
          f"micro-batch 1 sequence, fp32, {a.steps - 1} timed step(s) after 1, {a.repeats} repeats, "
          f"{os.cpu_count()} cores")
    print(f"{'alloc':<6} {'micro':>5} {'mode':<10} {'peak_grads_MiB':>16} {'whole_MiB':>9} {'tensors_MiB':>16} {'plan_MiB (err)':>15} {'peak_rss_MiB':>16} {'tok/s':>14} "
          f"{'rs_MiB/step':>11}")
    ok = True
    rows = {}  # (allocator, micro, mode) -> (peak_grads, peak_rss) medians
    micros = [int(m) for m in a.micro.split(",")]
    sharded_one = {}  # allocator -> sharded peak_grads at the first micro-batch count
    for micro in micros:
        for mode in ("sharded", "unsharded"):
            plan = planned_peak(a, micro, mode)
            runs = {x: [] for x in allocators}
            for _ in range(a.repeats):
                for allocator in allocators:  # in turn, so that drift on the machine reaches both
                    runs[allocator].append(run_once(a, allocator, micro, mode))
            for allocator in allocators:
                r = runs[allocator]
                grads = [x["grads"] for x in r]
                rss = [x["rss"] for x in r]
                whole, scratch = r[0]["whole"], r[0]["scratch"]
                print(f"{allocator:<6} {micro:>5} {mode:<10} {spread([g / mib for g in grads], '{:.1f}'):>16} "
                      f"{whole / mib:>9.1f} {spread([x['tensors'] / mib for x in r], '{:.0f}'):>16} "
                      f"{plan / mib:>7.0f} ({plan / statistics.median(x['tensors'] for x in r) - 1:+.0%}) "
                      f"{spread([v / mib for v in rss], '{:.0f}'):>16} {spread([x['tps'] for x in r], '{:.0f}'):>14} "
                      f"{statistics.median(x['rs'] for x in r) / mib:>11.1f}", flush=True)
                rows[(allocator, micro, mode)] = (statistics.median(grads), statistics.median(rss))
                if mode == "sharded":
                    first = sharded_one.setdefault(allocator, max(grads))
                    if max(grads) > first + scratch:
                        print(f"CHECK FAILED: sharded grew with {micro} micro-batches past one unit's scratch shard",
                              flush=True)
                        ok = False
                if mode == "unsharded" and micro > 1 and min(grads) < whole:
                    print(f"CHECK FAILED: unsharded at {micro} micro-batches held less than the whole gradient",
                          flush=True)
                    ok = False
    lo, hi = micros[0], micros[-1]
    for allocator in allocators:
        rss_lo, rss_hi = rows[(allocator, lo, "sharded")][1], rows[(allocator, hi, "sharded")][1]
        growth = rss_hi / rss_lo - 1
        held = rows[(allocator, hi, "unsharded")][0] - rows[(allocator, hi, "sharded")][0]
        grew = rows[(allocator, hi, "unsharded")][1] - rss_hi
        print(f"goal {allocator}: sharded peak RSS {rss_lo / mib:.0f} -> {rss_hi / mib:.0f} MiB from {lo} to {hi} "
              f"micro-batches ({growth:+.1%}; flat within 5%: {'met' if abs(growth) <= 0.05 else 'MISSED'}); "
              f"unsharded at {hi} holds {held / mib:.0f} MiB more gradient and {grew / mib:.0f} MiB more RSS")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
