"""`shardctl plan` against the engine on this machine: for the benchmark's
small GPT at N=2, the planner's per-rank state by kind must be within 5% of
the engine's own accounting, as bench/engine_bench.py runs it. The planner's
step time is compared with the measured one by bench/plan_accuracy.py, over
repeated runs: on this noisy machine a timed assertion would be a coin toss."""
import json
import os
import subprocess

import formulas
import harness

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
WORLD, BATCH, STEPS = 2, 8, 5


def main():
    c = harness.Checks()
    for strategy in ("no_shard", "shard_grad_op", "full_shard"):
        cfg = harness.small_gpt_config(strategy, WORLD, STEPS, BATCH)
        out, ranks = harness.run(cfg, WORLD, timeout=600, threads=1)
        r = subprocess.run([SHARDCTL, "--json", "plan", os.path.join(out, "job.toml"), "--workers", str(WORLD),
                            "--gpus-per-node", str(WORLD), "--gpu-memory", "1e12"],
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
    # A job file is checked at the world size planned (--workers), not at its
    # own [job] workers: shard groups of 2 do not divide the file's 1 worker.
    cfg = harness.small_gpt_config("hybrid_shard", 4, STEPS, BATCH)
    job = os.path.join(harness.scratch_dir("shardline-plan-"), "job.toml")
    harness.write_toml(cfg, job)
    r = subprocess.run([SHARDCTL, "--json", "plan", job, "--workers", "4", "--gpus-per-node", "2"],
                       capture_output=True, text=True, timeout=60)
    groups = {s["strategy"]: s["shard_group"] for s in json.loads(r.stdout)["strategies"]} if r.returncode == 0 else {}
    c.check(groups.get("hybrid_shard") == 2, "plan --workers 4 of a job with shard groups of 2",
            r.stderr.strip() or str(groups))
    check_comm_bytes(c)
    check_auto(c)
    check_flags(c)
    c.finish()


def plan_json(*args):
    r = subprocess.run([SHARDCTL, "--json", "plan", *args], capture_output=True, text=True, timeout=60)
    return r, (json.loads(r.stdout) if r.returncode == 0 else {})


def check_flags(c):
    """The model and batch flags replace the job file's keys before it is
    checked; --head-dim makes Qwen3-4B by flags 4.02e9 parameters (its
    config.json's count); where nothing fits, plan says at how many workers
    each strategy would, and what the seeds' other ways of fitting would
    plan to."""
    cfg = harness.small_gpt_config("full_shard", 2, STEPS, 2)  # batch_size 2: not divisible at 4 ranks
    job = os.path.join(harness.scratch_dir("shardline-plan-"), "job.toml")
    harness.write_toml(cfg, job)
    r, plan = plan_json(job, "--workers", "4", "--batch", "4")
    c.check(r.returncode == 0 and plan.get("tokens_per_step") == 4 * cfg["model"]["block_size"],
            "plan --batch replaces the file's batch_size before the divisibility check", r.stderr.strip())
    r, plan = plan_json(job, "--workers", "2", "--layers", "3")
    full = {s["strategy"]: s for s in plan.get("strategies", [])}.get("full_shard", {})
    r6, plan6 = plan_json(job, "--workers", "2")
    c.check(r.returncode == 0 and plan.get("params", 0) < plan6.get("params", 0) and full,
            "plan --layers replaces the file's n_layer", f"{plan.get('params')} vs {plan6.get('params')}")
    qwen3 = ["--family", "llama", "--layers", "36", "--hidden", "2560", "--heads", "32", "--kv-heads", "8",
             "--head-dim", "128", "--intermediate", "9728", "--vocab", "151936", "--tied", "--qk-norm", "--seq", "1024"]
    r, plan = plan_json(*qwen3)
    # Qwen3-4B: 4,022,468,096 parameters (its embedding tied, counted once).
    c.check(r.returncode == 0 and plan.get("params") == 4022468096, "plan --head-dim: Qwen3-4B by flags",
            str(plan.get("params")) + r.stderr.strip())
    # (At sequence 512: at 1024 bf16 state's activations and the caching
    # allocator's reserve pass 24 GB.)
    qwen3 = qwen3[:-1] + ["512"]
    r, plan = plan_json(*qwen3, "--workers", "2", "--gpu-memory", "24e9", "--batch", "2", "--micro-batch", "1",
                        "--dtype", "bf16")
    fits_at = plan.get("fits_at_workers", {})
    ways = {o["option"]: o for o in plan.get("ways_to_fit", [])}
    seeds = (ways.get("bf16 state (8 bytes a parameter)", {}).get("strategy") == "full_shard"
             and ways.get("QLoRA (NF4 base), one worker", {}).get("strategy") == "no_shard"
             and ways.get("CPU offload", {}).get("unsupported") == "not supported yet")
    c.check(r.returncode == 0 and not plan.get("recommended") and fits_at.get("full_shard", 0) > 2 and seeds,
            "nothing fits on two 24 GB GPUs: the fewest workers per strategy, and the seeds' ways to fit "
            "(bf16 state under full_shard, QLoRA on one GPU, offload named)", f"{fits_at} {list(ways.values())}")
    if fits_at.get("full_shard"):
        w = fits_at["full_shard"]
        _, at = plan_json(*qwen3, "--workers", str(w), "--gpu-memory", "24e9", "--batch", str(w),
                          "--micro-batch", "1", "--dtype", "bf16")
        _, below = plan_json(*qwen3, "--workers", str(w - 1), "--gpu-memory", "24e9", "--batch", str(w),
                             "--micro-batch", "1", "--dtype", "bf16")
        fs = {s["strategy"]: s for s in at.get("strategies", [])}.get("full_shard", {})
        fb = {s["strategy"]: s for s in below.get("strategies", [])}.get("full_shard", {})
        c.check((fs.get("fits") or fs.get("fits_checkpointed")) and not (fb.get("fits") or fb.get("fits_checkpointed")),
                f"full_shard fits at {w} workers and not at {w - 1}", "")
    r = subprocess.run([SHARDCTL, "plan", *qwen3, "--workers", "2", "--gpu-memory", "24e9", "--batch", "2",
                        "--micro-batch", "1"], capture_output=True, text=True, timeout=60)
    c.check("the fewest workers that fit" in r.stdout and "QLoRA (NF4 base), one worker" in r.stdout,
            "the table says so too", r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip())


def check_auto(c):
    """A job that says strategy = "auto": `plan` says what the coordinator
    would pick on the flags' cluster. Two nodes of two over a 300 Mbit/s link
    between them: a hybrid whose shard group is a node's ranks; one node of
    four: never a hybrid (its group would be the world)."""
    cfg = harness.small_gpt_config("full_shard", 4, STEPS, BATCH)
    cfg["parallelism"] = {"strategy": "auto"}
    job = os.path.join(harness.scratch_dir("shardline-plan-"), "auto.toml")
    harness.write_toml(cfg, job)
    picks = {}
    for per_node in (2, 4):
        r = subprocess.run([SHARDCTL, "--json", "plan", job, "--workers", "4", "--gpus-per-node", str(per_node),
                            "--intra-bw", "1e9", "--inter-bw", "37.5e6", "--flops", "5e10", "--gpu-memory", "1e12"],
                           capture_output=True, text=True, timeout=60)
        picks[per_node] = json.loads(r.stdout).get("auto", {}) if r.returncode == 0 else {"error": r.stderr.strip()}
    c.check(picks[2].get("strategy", "").startswith("hybrid_shard") and picks[2].get("shard_group_size") == 2,
            "plan of an auto job over two nodes of two: a hybrid with a node's ranks as its shard group", str(picks[2]))
    c.check("strategy" in picks[4] and not picks[4]["strategy"].startswith("hybrid"),
            "plan of an auto job on one node of four: no hybrid", str(picks[4]))
    r = subprocess.run([SHARDCTL, "plan", job, "--workers", "4", "--gpus-per-node", "2", "--inter-bw", "37.5e6"],
                       capture_output=True, text=True, timeout=60)
    c.check(r.returncode == 0 and 'strategy = "auto" here: auto: ' in r.stdout, "plan's table says auto's pick",
            r.stderr.strip() or r.stdout[-300:])


def check_comm_bytes(c):
    """The planner's bytes per step equal what the engine sent, for the
    tiny GPT and llama (tied and untied tables, vocabulary 1024) at N=4 in
    2 groups of 2, gathered and with the sparse embedding (whose rows'
    gradients are then gathered across the replicas). The engine's count
    less its last step's parameter gather for --out and the step's sums'
    all-reduces (norm, loss and vote: fp64 scalars), which the planner
    leaves out."""
    for model in ("gpt", "llama3"):
        for sparse in (False, True):
            cfg = harness.config("hybrid_shard", 4, train__steps=2, parallelism__sparse_embedding=sparse)
            if model != "gpt":
                cfg["model"] = harness.llama_model(model)
            cfg["model"]["vocab_size"] = 1024
            out, ranks = harness.run(cfg, 4)
            r = subprocess.run([SHARDCTL, "--json", "plan", os.path.join(out, "job.toml"), "--workers", "4",
                                "--gpus-per-node", "2"], capture_output=True, text=True, timeout=60)
            name = f"{model} hybrid_shard N=4{' sparse embedding' if sparse else ''}"
            if not c.check(r.returncode == 0, f"{name}: shardctl plan runs", r.stderr.strip()):
                continue
            plan = {s["strategy"]: s for s in json.loads(r.stdout)["strategies"]}["hybrid_shard"]
            G, R = 2, 2
            sizes = [formulas.padded(n, G) for n in formulas.unit_sizes(cfg["model"])]
            final_gather = sum(formulas.ring(s * 4, G) for s in sizes)
            scalars = formulas.ring_all_reduce(24, 8, G) + formulas.ring_all_reduce(16, 8, R)
            sent = sum(v["bytes"] for comm in ranks[0]["comm"].values() for v in comm.values())
            per_step = (sent - final_gather) / cfg["train"]["steps"] - scalars
            c.check(plan["comm_bytes"] == per_step, f"{name}: the planner's bytes per step are the engine's",
                    f"plan {plan['comm_bytes']} engine {per_step}")


if __name__ == "__main__":
    main()
