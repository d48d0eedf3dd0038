"""Full fine-tuning with the optimizer state in bf16 and in 8 bits beside fp32
state: the loss curve over a few hundred steps of a small GPT (full_shard at
N=2, bf16 parameters and reduction), and the bytes a parameter each holds
against the plan's.

    .venv/bin/python bench/optimizer_state_curve.py [--steps 300] [--lr 1e-3,1e-4]

Rows: for each learning rate, fp32 state (an fp32 master and fp32 moments,
[optimizer] master_dtype = moments_dtype = "fp32"), bf16 state (no master,
bf16 moments: torch.optim.AdamW on a bfloat16 model) and 8-bit moments (an
fp32 master, moments_dtype = "8bit": bitsandbytes' AdamW8bit). The loss is the
mean over a window of 10 steps ending at each column's step (the data is the
engine's synthetic stream, which has structure to learn). State bytes are the
engine's ledger on rank 0 (params + grads + master + optimizer) over the
parameters, beside `shardctl plan`'s for the same job. Tokens/s: the median
step. Without a master an update smaller than half a bf16 ulp of its weight
is lost, which a smaller learning rate shows more (torch on bf16 does the
same). One run per row: the figures here are losses and bytes, which do not
depend on this machine's noise; tokens/s is printed for scale only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import formulas  # noqa: E402
import harness  # noqa: E402

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 2048, "block_size": 128}
WORLD, BATCH = 2, 16
WINDOW = 10


# name: (master_dtype, moments_dtype)
STATES = {"fp32": ("fp32", "fp32"), "bf16": ("bf16", "bf16"), "8bit": ("fp32", "8bit")}


def job(steps, lr, state):
    master, moments = STATES[state]
    cfg = harness.config("full_shard", WORLD, micro_batches=1, precision__param_dtype="bf16",
                         precision__reduce_dtype="bf16", optimizer__master_dtype=master,
                         optimizer__moments_dtype=moments, optimizer__lr=lr, optimizer__min_lr=lr / 10,
                         optimizer__warmup_steps=20)
    cfg["model"] = dict(MODEL)
    cfg["train"].update(steps=steps, batch_size=BATCH, micro_batch_size=BATCH // WORLD, log_interval=0)
    return cfg


def planned_state_bytes(cfg):
    path = os.path.join(harness.scratch_dir("shardline-curve-plan-"), "job.toml")
    harness.write_toml(cfg, path)
    out = subprocess.run([SHARDCTL, "plan", path, "--workers", str(WORLD), "--json"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    plan = json.loads(out)
    return next(s for s in plan["strategies"] if s["strategy"] == "full_shard")["state_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", default="1e-3,1e-4")
    args = ap.parse_args()
    cols = sorted({WINDOW - 1, 49, 99, 199, args.steps - 1} & set(range(WINDOW - 1, args.steps)))
    P = sum(formulas.unit_sizes(MODEL))
    print(f"GPT {MODEL['n_layer']}x{MODEL['n_embd']}, vocab {MODEL['vocab_size']}, seq {MODEL['block_size']} "
          f"({P / 1e6:.2f}M parameters); full_shard at N={WORLD}, batch {BATCH}, bf16 parameters and reduction, "
          f"{args.steps} steps; loss: mean of the {WINDOW} steps ending at each step")
    print()
    head = "| lr | state | " + " | ".join(f"loss @{c + 1}" for c in cols) + \
        " | state B/param (engine) | state B/param (plan) | tokens/s |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for lr in (float(x) for x in args.lr.split(",")):
        for state in STATES:
            cfg = job(args.steps, lr, state)
            _, ranks = harness.run(cfg, WORLD, timeout=3600)
            steps = ranks[0]["steps"]
            losses = [s["loss"] for s in steps]
            mem = ranks[0]["memory"]
            held = mem["params"] + mem["grads"] + mem["master"] + mem["optimizer"]
            tokens = BATCH * MODEL["block_size"]
            tps = tokens / statistics.median(s["seconds"] for s in steps[1:])
            curve = " | ".join(f"{statistics.mean(losses[c + 1 - WINDOW:c + 1]):.4f}" for c in cols)
            print(f"| {lr:g} | {state} | {curve} | {held * WORLD / P:.2f} | "
                  f"{planned_state_bytes(cfg) * WORLD / P:.2f} | {tps:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
