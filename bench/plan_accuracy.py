"""How well `shardctl plan` predicts the step time on this machine: for the
small GPT at N=2 (as bench/engine_bench.py runs it), the planner's predicted
step time next to the engine's measured one, for each strategy, over several
repetitions. Prints one table: the prediction, the median measured step and the
spread of the measurements, and the prediction's error against the median.

    .venv/bin/python bench/plan_accuracy.py [--repeats 3] [--strategies a,b]

The planner needs this machine's figures, measured here independently of the
engine: FLOP/s from PyTorch's forward and backward of the same GPT (the
oracle's nanoGPT model) at one rank's micro-batch on one thread, as each rank
runs; Gloo bus bandwidth from collective_bench; memory bandwidth from a large
tensor add. Each repetition measures them again, because this VM's neighbours
move every figure by 10-30%: that noise is why this is a benchmark and not a
test (tests/integration/plan_check.py checks the planner's bytes, which are
exact)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "oracle"))
import harness  # noqa: E402
import torch  # noqa: E402
from nanogpt import GPT  # noqa: E402

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
COLL_BENCH = os.path.join(harness.BUILD, "bench", "collective_bench")
MODEL = harness.SMALL_GPT
WORLD, BATCH, STEPS = 2, 8, 5


def best_time(fn, reps=3):
    fn()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_flops(micro):
    torch.set_num_threads(1)
    L, H, C, V, T = (MODEL[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"))
    model = GPT(L, H, C, V, T)
    x = torch.randint(0, V, (micro, T))

    def step():
        model(x, x)[1].backward()

    t = best_time(step)
    n = sum(p.numel() for p in model.parameters()) - T * C  # without wpe, as the formula counts
    return (6 * n + 12 * L * C * T) * micro * T / t


def measure_mem_bw():
    a, b = torch.ones(32 << 20), torch.ones(32 << 20)
    t = best_time(lambda: a.add_(b))
    return 3 * a.numel() * 4 / t  # two reads, one write


def measure_gloo_busbw():
    out = subprocess.run([COLL_BENCH, "--world", str(WORLD), "--min-bytes", str(4 << 20), "--max-bytes",
                          str(4 << 20), "--rounds", "1"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line and not line.startswith("#")}
    return float(rows["all_gather"][4]) * 1e9  # busbw, GB/s


def predicted_step(job_toml, strategy, flops, mem_bw, busbw):
    r = subprocess.run([SHARDCTL, "--json", "plan", job_toml, "--workers", str(WORLD), "--gpus-per-node",
                        str(WORLD), "--flops", str(flops), "--mem-bw", str(mem_bw), "--intra-bw", str(busbw),
                        "--inter-bw", str(busbw), "--gpu-memory", "1e12"],
                       capture_output=True, text=True, timeout=60, check=True)
    return {s["strategy"]: s for s in json.loads(r.stdout)["strategies"]}[strategy]["step_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--strategies", default="no_shard,shard_grad_op,full_shard")
    args = ap.parse_args()
    strategies = args.strategies.split(",")
    predicted = {s: [] for s in strategies}
    measured = {s: [] for s in strategies}
    for rep in range(args.repeats):
        flops, mem_bw, busbw = measure_flops(BATCH // WORLD), measure_mem_bw(), measure_gloo_busbw()
        print(f"# repeat {rep + 1}: {flops / 1e9:.1f} GFLOP/s per thread, {mem_bw / 1e9:.1f} GB/s memory, "
              f"{busbw / 1e9:.2f} GB/s Gloo bus bandwidth", flush=True)
        for strategy in strategies:
            cfg = harness.small_gpt_config(strategy, WORLD, STEPS, BATCH)
            out, ranks = harness.run(cfg, WORLD, timeout=600, threads=1)
            # The best timed step of the run, as the calibration keeps its best.
            measured[strategy].append(min(s["seconds"] for s in ranks[0]["steps"][1:]))
            predicted[strategy].append(predicted_step(os.path.join(out, "job.toml"), strategy, flops, mem_bw, busbw))
    print(f"# small GPT {MODEL} at N={WORLD}, global batch {BATCH}, {args.repeats} repeats, "
          f"{os.cpu_count()} cores; error = median predicted / median measured - 1")
    print(f"{'strategy':<15} {'pred_s':>7} {'meas_s':>7} {'meas_min':>8} {'meas_max':>8} {'error':>7}")
    for s in strategies:
        p, m = statistics.median(predicted[s]), statistics.median(measured[s])
        print(f"{s:<15} {p:>7.3f} {m:>7.3f} {min(measured[s]):>8.3f} {max(measured[s]):>8.3f} {p / m - 1:>+7.0%}")


if __name__ == "__main__":
    main()
