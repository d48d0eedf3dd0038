"""Gradient memory under gradient accumulation (issue 26): the small GPT
under full_shard at N = 2 with 1, 4 and 16 micro-batches per rank, in both
[train] grad_accumulation modes. Sharded keeps a rank's gradients near 1/N
of the model whatever the micro-batch count; unsharded holds every unit's
whole gradient across micro-batches.

Columns (medians of --repeats runs, [min-max] where they vary):
    peak_grads   the engine's ledger: the most gradient bytes a rank held
    whole        the model's gradient in reduce_dtype (fp32), for scale
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

    .venv/bin/python bench/accumulation_memory.py [--micro 1,4,16] [--repeats 3] [--seq 64]
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import harness  # noqa: E402

WORLD = 2


def spread(values, fmt):
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return fmt.format(mid) if lo == hi else f"{fmt.format(mid)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    mib = 1 << 20
    print(f"# accumulation_memory: small GPT {harness.SMALL_GPT} at block {a.seq}, full_shard N={WORLD}, "
          f"micro-batch 1 sequence, fp32, {a.steps - 1} timed step(s) after 1, {a.repeats} repeats, "
          f"{os.cpu_count()} cores")
    print(f"{'micro':>5} {'mode':<10} {'peak_grads_MiB':>16} {'whole_MiB':>9} {'peak_rss_MiB':>16} {'tok/s':>14} "
          f"{'rs_MiB/step':>11}")
    ok = True
    sharded_one = None  # sharded peak_grads at the first micro-batch count
    for micro in [int(m) for m in a.micro.split(",")]:
        for mode in ("sharded", "unsharded"):
            cfg = harness.small_gpt_config("full_shard", WORLD, a.steps, WORLD * micro)
            cfg["model"]["block_size"] = a.seq
            cfg["train"]["micro_batch_size"] = 1
            cfg["train"]["grad_accumulation"] = mode
            grads, rss, tps, rs = [], [], [], []
            for _ in range(a.repeats):
                _, ranks = harness.run(cfg, WORLD, timeout=1800, threads=1)
                grads.append(max(r["memory"]["peak_grads"] for r in ranks))
                rss.append(max(r["memory"]["peak_rss"] for r in ranks))
                timed = ranks[0]["steps"][1:]
                tps.append(WORLD * micro * a.seq / (sum(s["seconds"] for s in timed) / len(timed)))
                rs.append(ranks[0]["comm"]["shard"]["reduce_scatter"]["bytes"] / a.steps)
            whole = sum(u["padded"] for u in ranks[0]["units"]) * 4
            scratch = max(u["shard"] for u in ranks[0]["units"]) * 4
            print(f"{micro:>5} {mode:<10} {spread([g / mib for g in grads], '{:.1f}'):>16} {whole / mib:>9.1f} "
                  f"{spread([r / mib for r in rss], '{:.0f}'):>16} {spread(tps, '{:.0f}'):>14} "
                  f"{statistics.median(rs) / mib:>11.1f}", flush=True)
            if mode == "sharded":
                sharded_one = sharded_one if sharded_one is not None else max(grads)
                if max(grads) > sharded_one + scratch:
                    print(f"CHECK FAILED: sharded grew with {micro} micro-batches past one unit's scratch shard",
                          flush=True)
                    ok = False
            if mode == "unsharded" and micro > 1 and min(grads) < whole:
                print(f"CHECK FAILED: unsharded at {micro} micro-batches held less than the whole gradient", flush=True)
                ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
