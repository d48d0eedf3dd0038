"""Engine benchmark: a small GPT (6 layers, width 512, block 256, vocab 16384)
at N = 1, 2, 4 ranks (separate processes on loopback, Gloo) for every
strategy. Prints one table: tokens/s, step time split into compute, exposed
communication (time the step thread waited on collectives: all-gathers,
reduce-scatters, all-reduces) and the optimizer's update, peak RSS per rank,
model-state bytes per rank, the engine's peak bytes during a step (its ledger:
state and unsharded units), and the measured peak of every tensor byte of the
rank during a step (activations and temporaries included).

    .venv/bin/python bench/engine_bench.py [--steps 4] [--worlds 1,2,4] [--strategies a,b]

The first step is a warm-up and is left out of the figures. On a machine with
fewer cores than ranks the ranks share cores (each gets
max(1, cores // N) intra-op threads), which is stated in the header.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import harness  # noqa: E402

SMALL_GPT = harness.SMALL_GPT


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--strategies", default=",".join(harness.STRATEGIES))
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    cores = os.cpu_count()
    print(f"# small GPT {SMALL_GPT}, global batch {args.batch} x {SMALL_GPT['block_size']} tokens, fp32, "
          f"{args.steps - 1} timed steps after 1 warm-up, {cores} cores")
    print(f"{'strategy':<19} {'N':>2} {'thr':>3} {'tokens/s':>9} {'step_s':>7} {'compute_s':>9} "
          f"{'exp_AG_s':>8} {'exp_RS_s':>8} {'exp_AR_s':>8} {'optim_s':>7} "
          f"{'peak_rss_MiB':>12} {'state_MiB':>9} {'peak_MiB':>8} {'tensors_MiB':>11} {'loss':>7}")
    for world in [int(w) for w in args.worlds.split(",")]:
        threads = max(1, cores // world)
        for strategy in args.strategies.split(","):
            cfg = harness.small_gpt_config(strategy, world, args.steps, args.batch)
            _, ranks = harness.run(cfg, world, timeout=1800, threads=threads)
            timed = ranks[0]["steps"][1:]
            step = sum(s["seconds"] for s in timed) / len(timed)

            def mean(key):  # rank 0's, whose step time is reported
                return sum(s[key] for s in timed) / len(timed)
            ag, rs = mean("exposed_all_gather_seconds"), mean("exposed_reduce_scatter_seconds")
            ar = mean("exposed_comm_seconds") - ag - rs
            opt = mean("optimizer_seconds")
            tokens = args.batch * SMALL_GPT["block_size"]
            mib = 1 << 20
            print(f"{strategy:<19} {world:>2} {threads:>3} {tokens / step:>9.0f} {step:>7.3f} "
                  f"{step - ag - rs - ar - opt:>9.3f} {ag:>8.3f} {rs:>8.3f} {ar:>8.3f} {opt:>7.3f} "
                  f"{max(r['memory']['peak_rss'] for r in ranks) / mib:>12.0f} "
                  f"{ranks[0]['memory']['state'] / mib:>9.1f} {ranks[0]['memory']['peak'] / mib:>8.1f} "
                  f"{max(r['memory']['tensor_peak'] for r in ranks) / mib:>11.1f} "
                  f"{timed[-1]['loss']:>7.4f}", flush=True)


if __name__ == "__main__":
    main()
