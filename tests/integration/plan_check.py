"""`shardctl plan` against the engine on this machine: for the benchmark's
small GPT at N=2, the planner's per-rank state by kind must be within 5% of
the engine's own accounting, and its predicted step time within 25% of the
step time the engine measures (as bench/engine_bench.py runs it).

The planner needs this machine's figures, measured here independently of the
engine: FLOP/s from PyTorch's forward and backward of the same GPT (the
oracle's nanoGPT model) at one rank's micro-batch, on one thread as each rank
runs, Gloo bus bandwidth from
collective_bench, and memory bandwidth from a large tensor add."""
import json
import os
import re
import subprocess
import sys
import time

import harness
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
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
                          str(4 << 20), "--rounds", "1"], capture_output=True, text=True, timeout=120).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line and not line.startswith("#")}
    return float(rows["all_gather"][4]) * 1e9  # busbw, GB/s


def main():
    c = harness.Checks()
    micro = BATCH // WORLD
    flops, mem_bw, busbw = measure_flops(micro), measure_mem_bw(), measure_gloo_busbw()
    print(f"this machine: {flops / 1e9:.1f} GFLOP/s per thread (PyTorch GPT fwd+bwd), "
          f"{mem_bw / 1e9:.1f} GB/s memory, {busbw / 1e9:.2f} GB/s Gloo bus bandwidth")
    for strategy in ("no_shard", "shard_grad_op", "full_shard"):
        cfg = harness.small_gpt_config(strategy, WORLD, STEPS, BATCH)
        out, ranks = harness.run(cfg, WORLD, timeout=600, threads=1)
        timed = ranks[0]["steps"][1:]
        # The best step, as the calibration keeps its best run: this VM's
        # neighbours slow single runs by up to a third.
        measured = min(s["seconds"] for s in timed)
        r = subprocess.run([SHARDCTL, "--json", "plan", os.path.join(out, "job.toml"), "--workers", str(WORLD),
                            "--gpus-per-node", str(WORLD), "--flops", str(flops), "--mem-bw", str(mem_bw),
                            "--intra-bw", str(busbw), "--inter-bw", str(busbw), "--gpu-memory", "1e12"],
                           capture_output=True, text=True, timeout=60)
        if not c.check(r.returncode == 0, f"{strategy}: shardctl plan runs", r.stderr.strip()):
            continue
        plan = {s["strategy"]: s for s in json.loads(r.stdout)["strategies"]}[strategy]
        mem = ranks[0]["memory"]
        for kind in ("params", "grads", "master", "optimizer"):
            want, got = mem[kind], plan[f"{kind}_bytes"]
            ok = abs(got - want) <= 0.05 * max(want, 1) if want else got == 0
            c.check(ok, f"{strategy}: {kind} bytes within 5% of the engine's", f"plan {got} engine {want}")
        c.check(abs(plan["state_bytes"] - mem["state"]) <= 0.05 * mem["state"],
                f"{strategy}: state bytes within 5%", f"plan {plan['state_bytes']} engine {mem['state']}")
        ledger_transient = mem["peak"] - mem["state"] - mem["activation_peak"]
        print(f"  {strategy}: transient units plan {plan['transient_bytes']} vs engine ledger {ledger_transient}; "
              f"activations plan {plan['activation_bytes']} vs allocator {mem['tensor_peak'] - mem['peak']}")
        err = plan["step_s"] / measured - 1
        c.check(abs(err) <= 0.25, f"{strategy}: predicted step time within 25% of measured",
                f"plan {plan['step_s']:.3f}s (compute {plan['compute_s']:.3f}, exposed comm "
                f"{plan['exposed_comm_s']:.3f}, optimizer {plan['optimizer_s']:.3f}) vs measured {measured:.3f}s "
                f"({err:+.0%})")
    c.finish()


if __name__ == "__main__":
    main()
