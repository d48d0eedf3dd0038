"""Equivalence: for one strategy at world sizes 1..4 (separate processes on
loopback), 10 steps of a tiny GPT in fp32 with 2 micro-batches per rank,
clipping, warmup and cosine end within 2e-5 (max abs) of the single-process
run's parameters, with per-step losses within 1e-6 relative. The bytes each
rank sent, by collective, must equal the ring formulas. Strategies that shard
gradients run twice, with sharded and with unsharded accumulation over the
micro-batches; on an 8-layer model with 4 micro-batches the second holds the
whole gradient and the first at least half of it less. Each run's timeline
(shardline-train --trace) must agree with its report.

    equivalence.py STRATEGY [--checkpointing] [--prefetch none|post] [--model llama3|qwen2|qwen3]
                   [--sparse-embedding] [--shard-optimizer-across-replicas] [--vocab V]
                   [--worlds 1,2,3,4]

--model runs one of harness.LLAMA_MODELS instead of the tiny GPT-2.
"""
import argparse
import json
import os

import numpy as np

import formulas
import harness

# harness.reorder_param_tol at the harness's lr (6e-4) over its 10 steps.
PARAM_TOL = harness.reorder_param_tol(6e-4, 10)
LOSS_TOL = 1e-6


def check_time_split(checks, name, ranks, moving):
    """Each step's split of its time (StepResult): the waits on all-gathers
    and on reduce-scatters are parts of the exposed communication, every
    step spent time in the optimizer, and its CPU clocks are consistent. A
    step never waited on an op kind the rank never issued; it did on one
    that moved bytes between processes
    (`moving`, from formulas): dozens of host waits on Gloo ops over a run add
    up to more than nothing, so a wait filed under the wrong kind shows."""
    bad = []
    for r in ranks:
        issued = {op for c in r["comm"].values() for op, v in c.items() if v["calls"] > 0}
        total = {"all_gather": 0.0, "reduce_scatter": 0.0}
        for s in r["steps"]:
            ag, rs = s["exposed_all_gather_seconds"], s["exposed_reduce_scatter_seconds"]
            total["all_gather"] += ag
            total["reduce_scatter"] += rs
            if not (ag >= 0 and rs >= 0 and ag + rs <= s["exposed_comm_seconds"] + 1e-9 and s["optimizer_seconds"] > 0):
                bad.append(f"rank {r['rank']} step {s['step']}: all-gather {ag}, reduce-scatter {rs}, "
                           f"exposed {s['exposed_comm_seconds']}, optimizer {s['optimizer_seconds']}")
            # CPU clocks: the step thread's is part of the process's, and no
            # thread outruns the wall clock (10 ms: the clocks' tick slack).
            cpu, thread = s["cpu_seconds"], s["step_thread_cpu_seconds"]
            if not (0 < thread <= cpu + 0.01 and thread <= s["seconds"] + 0.01
                    and cpu <= s["seconds"] * (os.cpu_count() or 1) + 0.01):
                bad.append(f"rank {r['rank']} step {s['step']}: cpu {cpu}, step thread cpu {thread}, "
                           f"seconds {s['seconds']}")
        for op, t in total.items():
            if (t > 0 and op not in issued) or (op in moving and t == 0):
                bad.append(f"rank {r['rank']}: {t} s waiting on {op} ({'issued' if op in issued else 'never issued'}"
                           f"{', moving bytes' if op in moving else ''})")
    checks.check(not bad, f"{name} step time split (exposed all-gather, reduce-scatter, optimizer, CPU)", "; ".join(bad[:2]))


def check_timeline(checks, name, out, ranks, cfg, world):
    """Each rank's --trace timeline agrees with its report: per step, its
    waits add up to the step's exposed communication (each span's
    microseconds are truncated: 1 us each), every unit ran forward and
    backward once per micro-batch, and every collective the communicators
    counted is a span of its lane."""
    t = cfg["train"]
    micro = t["batch_size"] // world // t["micro_batch_size"]
    bad = []
    for r in ranks:
        with open(os.path.join(out, f"trace-rank-{r['rank']}.json")) as f:
            trace = json.load(f)
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        lanes = {lane: sum(1 for e in spans if e["tid"] == tid) for tid, lane in enumerate(["step", "shard", "replicate"])}
        for lane in ("shard", "replicate"):
            calls = sum(v["calls"] for v in r["comm"][lane].values())
            if lanes[lane] != calls:
                bad.append(f"rank {r['rank']}: {lanes[lane]} {lane} spans, {calls} collectives counted")
        for s in r["steps"]:
            step = [e for e in spans if e["tid"] == 0 and e["name"] == f"step {s['step'] + 1}"]
            if len(step) != 1:
                bad.append(f"rank {r['rank']}: {len(step)} spans of step {s['step'] + 1}")
                continue
            lo, hi = step[0]["ts"], step[0]["ts"] + step[0]["dur"]
            inside = [e for e in spans if e["tid"] == 0 and lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
            waits = [e["dur"] for e in inside if e["name"].startswith("wait ")]
            if abs(sum(waits) * 1e-6 - s["exposed_comm_seconds"]) > len(waits) * 1e-6 + 1e-9:
                bad.append(f"rank {r['rank']} step {s['step']}: waits {sum(waits) * 1e-6:.6f} s, "
                           f"exposed {s['exposed_comm_seconds']:.6f} s")
            for u in r["units"]:
                for phase in ("forward", "backward"):
                    n = sum(1 for e in inside if e["name"] == f"{phase} {u['unit']}")
                    if n != micro:
                        bad.append(f"rank {r['rank']} step {s['step']}: {n} spans of {phase} {u['unit']}, {micro} expected")
    checks.check(not bad, f"{name} timeline (--trace) agrees with the report", "; ".join(bad[:2]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("strategy")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--backward-prefetch", default="pre")
    ap.add_argument("--worlds", default="1,2,3,4")
    ap.add_argument("--model", choices=sorted(harness.LLAMA_MODELS))
    ap.add_argument("--sparse-embedding", action="store_true", help="[parallelism] sparse_embedding = true")
    ap.add_argument("--shard-optimizer-across-replicas", action="store_true",
                    help="[parallelism] shard_optimizer_across_replicas = true")
    ap.add_argument("--vocab", type=int, default=0, help="the model's vocab_size (default: the tiny model's)")
    args = ap.parse_args()
    checks = harness.Checks()
    extra = {"memory__activation_checkpointing": args.checkpointing,
             "prefetch__backward": args.backward_prefetch,
             "parallelism__sparse_embedding": args.sparse_embedding,
             "parallelism__shard_optimizer_across_replicas": args.shard_optimizer_across_replicas}

    def config(strategy, world, **kw):
        cfg = harness.config(strategy, world, **kw)
        if args.model:
            cfg["model"] = harness.llama_model(args.model)
        if args.vocab:
            cfg["model"]["vocab_size"] = args.vocab
        return cfg

    ref_out, ref = harness.run(config("no_shard", 1), 1)
    ref_params = harness.load_params(ref_out)
    ref_losses = [s["loss"] for s in ref[0]["steps"]]
    checks.check(ref_losses[-1] < ref_losses[0], "reference loss falls",
                 f"{ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
    worst_param, worst_loss = 0.0, 0.0
    # Where gradients are sharded, both ways of accumulating them over the
    # micro-batches (job_config.h GradAccumulation) equal one process.
    modes = ["sharded", "unsharded"] if args.strategy in formulas.SHARDS_GRADS else ["sharded"]
    for world in [int(w) for w in args.worlds.split(",")]:
        for mode in modes:
            cfg = config(args.strategy, world, train__grad_accumulation=mode, **extra)
            out, ranks = harness.run(cfg, world, extra_args=("--trace",))
            params = harness.load_params(out)
            diff = max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params)
            losses = [s["loss"] for s in ranks[0]["steps"]]
            rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            worst_param, worst_loss = max(worst_param, diff), max(worst_loss, rel)
            name = f"{args.strategy} N={world}" + (f" ({mode} accumulation)" if len(modes) > 1 else "")
            checks.check(diff <= PARAM_TOL, f"{name} params", f"max abs diff {diff:.3e} (tol {PARAM_TOL})")
            checks.check(rel <= LOSS_TOL, f"{name} losses", f"max rel diff {rel:.3e} (tol {LOSS_TOL})")
            # Every rank's loss agrees (they all-reduce it).
            checks.check(all(r["steps"][-1]["loss"] == ranks[0]["steps"][-1]["loss"] for r in ranks),
                         f"{name} ranks agree on the loss")
            expected = formulas.comm_bytes(cfg, world, cfg["train"]["steps"])
            for r in ranks:
                got = {(c, op): r["comm"][c][op]["bytes"] for (c, op) in expected}
                checks.check(got == expected, f"{name} rank {r['rank']} bytes per collective",
                             "" if got == expected else f"got {got} expected {expected}")
            check_time_split(checks, name, ranks, {op for (_, op), b in expected.items() if b > 0})
            check_timeline(checks, name, out, ranks, cfg, world)
    if len(modes) > 1 and not args.vocab:
        # Gradient memory, on a deeper model with 4 micro-batches at N = 2:
        # unsharded accumulation holds every unit's whole gradient across
        # the micro-batches; sharded holds the shard plus the units in flight
        # (one reduction at a time), below that. (Its premise, units far
        # smaller than the model, holds at the tiny model's vocabulary, not
        # at a --vocab that makes the table most of it.)
        peak = {}
        for mode in modes:
            cfg = config(args.strategy, 2, micro_batches=4, train__grad_accumulation=mode, train__steps=2)
            cfg["model"]["n_layer"] = 8
            _, ranks = harness.run(cfg, 2)
            peak[mode] = max(r["memory"]["peak_grads"] for r in ranks)
        full = sum(formulas.unit_sizes(cfg["model"])) * 4
        checks.check(peak["unsharded"] >= full and peak["sharded"] < peak["unsharded"] - full // 2,
                     f"{args.strategy} N=2 gradient memory: unsharded accumulation holds the whole gradient, "
                     "sharded at least half of it less",
                     f"peak grads {peak['sharded']} B sharded, {peak['unsharded']} B unsharded, whole {full} B")
    print(f"WORST {args.strategy}: params max abs {worst_param:.3e}, losses max rel {worst_loss:.3e}")
    checks.finish()


if __name__ == "__main__":
    main()
