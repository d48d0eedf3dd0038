"""8-bit Adam moments: [optimizer] moments_dtype = "8bit", bitsandbytes'
AdamW8bit (blockwise dynamic quantization; tensors under 4096 elements keep
fp32 moments), with an fp32 master; a GPT whose matrices and tied table are
8-bit and whose norms and biases are not.

1. One process against bitsandbytes: the nanoGPT reference trained by
   bitsandbytes.optim.AdamW8bit (its CPU backend) with clip_grad_norm_ and
   the same schedule, on the engine's batches; ten steps.
2. Every strategy at N = 2, 3, 4 (and hybrid_shard with its optimizer across
   the replicas) against the engine's one process.
3. Bytes: the optimizer's bytes on rank 0 are shardctl plan's.
   With a bf16 master on bf16 parameters, one process against bitsandbytes
   on a bfloat16 nanoGPT (its update in fp32, rounded into the weights), held
   as bf16_state.py holds bf16 state.
4. Checkpoints: each rank file holds the moments' values (fp32) and its
   codes and scales (U8, F32); a resume over the same shards (N=2
   full_shard) reads the codes back and is bitwise the uninterrupted run; at
   N=3 the values are quantized again into the new shards' blocks, and the
   run continues within the bound below.
5. Bad input: 8-bit moments with a bf16 master on fp32 parameters refused
   naming the key.

Tolerance. Quantizing a moment picks its 16-bit cell's code: two runs whose
gradients differ by rounding (another kernel, another split of the batch,
~1e-6 relative in fp32) pick another code only where a moment sits within
that difference of a cell's edge, and then the element's update differs by
up to a code's step of its moments, at worst an update of the other sign,
2 * lr. So every element is held to 2 * lr * S, the worst case, and, because
a flip needs a moment within ~1e-6 of an edge of a cell 3e-5 of its block's
absmax wide, most elements see no flip at all: the median element is held to
the fp32 reorder bound (harness.reorder_param_tol), which a wrong block, a
wrong map or a stale shard (that move every element of it) fail. Losses: a
flipped element's update moves the loss by |g| * 2 lr at most; within 1e-4
relative over ten steps (their curves, not their bits). A resume at another
world size quantizes every moment once more, into new blocks: each moves by
up to a quantization step (about 1% of its block's scale), so every update
of the steps after it may move by about 1% too, and the loss by about 1% of
what those steps moved it (~10% here): 1e-3 relative.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

import harness

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from nanogpt import fp32_loss, model_from, train_reference  # noqa: E402

torch.set_num_threads(1)

STEPS = 10
LR = harness.TINY["optimizer"]["lr"]
EIGHT_BIT = {"optimizer__moments_dtype": "8bit", "model__n_embd": 64}
LOSS_TOL = 1e-4
REQUANTIZED_LOSS_TOL = 1e-3
SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")


def within(checks, name, got, want, losses, want_losses, steps=STEPS, loss_tol=LOSS_TOL):
    diffs = np.concatenate([np.abs(np.asarray(got[k], np.float64) - np.asarray(want[k], np.float64)).ravel()
                            for k in want])
    median, worst = float(np.median(diffs)), float(diffs.max())
    checks.check(worst <= 2 * LR * steps and median <= harness.reorder_param_tol(LR, steps), f"{name} params",
                 f"median {median:.2e} (tol {harness.reorder_param_tol(LR, steps):.1e}), max {worst:.2e} "
                 f"(tol {2 * LR * steps:.1e}), {float(np.mean(diffs > 1e-5)):.3%} of elements beyond 1e-5")
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
    checks.check(rel <= loss_tol, f"{name} losses", f"max rel diff {rel:.2e} (tol {loss_tol:.0e})")


def against_bitsandbytes(checks):
    import bitsandbytes as bnb
    cfg = harness.config("no_shard", 1, **EIGHT_BIT)
    dump = harness.step0_dump(cfg, "shardline-8bit-")
    made = []

    def adamw8bit(groups, lr, betas, eps):
        made.append(bnb.optim.AdamW8bit(groups, lr=lr, betas=betas, eps=eps))
        return made[-1]

    ref, bnb_losses = train_reference(dump, cfg, optimizer=adamw8bit)
    kinds = {st["state1"].dtype for st in made[0].state.values()}
    checks.check(kinds == {torch.uint8, torch.float32}, "bitsandbytes keeps 8-bit and fp32 moments in this model",
                 str(sorted(map(str, kinds))))
    ref = {k: v.numpy() for k, v in ref.items() if k != "lm_head.weight"}
    run_out, ranks = harness.run(cfg, 1)
    within(checks, "N=1 vs bitsandbytes AdamW8bit", harness.load_params(run_out), ref,
           [s["loss"] for s in ranks[0]["steps"]], bnb_losses)


def bf16_master_against_bitsandbytes(checks):
    import bitsandbytes as bnb
    import bf16_state
    cfg = harness.config("no_shard", 1, precision__param_dtype="bf16", precision__reduce_dtype="bf16",
                         optimizer__master_dtype="bf16", **EIGHT_BIT)
    dump = harness.step0_dump(cfg, "shardline-8bit-bf16-")
    model = model_from(dump, cfg["model"]).to(torch.bfloat16)
    ref, bnb_losses = train_reference(dump, cfg, model=model, loss_of=fp32_loss,
                                      optimizer=lambda g, lr, betas, eps: bnb.optim.AdamW8bit(g, lr=lr, betas=betas,
                                                                                              eps=eps))
    ref = {k: v.float().numpy() for k, v in ref.items() if k != "lm_head.weight"}
    run_out, ranks = harness.run(cfg, 1)
    name = "N=1 bf16 master vs bitsandbytes AdamW8bit on bf16 parameters"
    bf16_state.within(harness.load_params(run_out), ref, STEPS, checks, name)
    bf16_state.losses_within([s["loss"] for s in ranks[0]["steps"]], bnb_losses, checks, name)


def planned_optimizer_bytes(cfg, world):
    path = os.path.join(harness.scratch_dir("shardline-8bit-plan-"), "job.toml")
    harness.write_toml(cfg, path)
    out = subprocess.run([SHARDCTL, "plan", path, "--workers", str(world), "--json"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    strategy = cfg["parallelism"]["strategy"]
    return next(s for s in json.loads(out)["strategies"] if s["strategy"] == strategy)["optimizer_bytes"]


def strategies(checks, ref_params, ref_losses):
    pieces = {"parallelism__shard_optimizer_across_replicas": True}
    runs = [(s, w, {}) for s in harness.STRATEGIES for w in (2, 3, 4)] + [("hybrid_shard", 4, pieces)]
    for strategy, world, kw in runs:
        if strategy.startswith("hybrid") and world == 3:
            continue  # (no grouping of 3 with replicas)
        cfg = harness.config(strategy, world, micro_batches=1 if world == 3 else 2, **EIGHT_BIT, **kw)
        out, ranks = harness.run(cfg, world)
        name = f"{strategy}{' (optimizer across replicas)' if kw else ''} N={world}"
        within(checks, name, harness.load_params(out), ref_params, [s["loss"] for s in ranks[0]["steps"]],
               ref_losses)
        planned, got = planned_optimizer_bytes(cfg, world), ranks[0]["memory"]["optimizer"]
        checks.check(got == planned, f"{name}: rank 0's optimizer bytes are the plan's", f"{got} vs {planned}")


def checkpoints(checks, ref_params, ref_losses):
    save = 5
    base = harness.config("full_shard", 2, **EIGHT_BIT)
    two_out, two = harness.run(base, 2)
    two_params = harness.load_params(two_out)
    ckpt = harness.scratch_dir("shardline-8bit-ckpt-")
    harness.run(base, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", str(save), "--stop-after", str(save)])
    step_dir = os.path.join(ckpt, "tiny", "step-%08d" % save)
    with open(os.path.join(step_dir, "rank-00001.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    kinds = {k[len("h.0."):]: v["dtype"] for k, v in header.items() if k.startswith("h.0.")}
    checks.check(kinds == {"param": "F32", "exp_avg": "F32", "exp_avg_sq": "F32", "exp_avg.q8": "U8",
                           "exp_avg_sq.q8": "U8", "exp_avg.absmax": "F32", "exp_avg_sq.absmax": "F32"},
                 "a rank file holds the moments' values and their codes and scales", str(kinds))
    for strategy, world in (("full_shard", 2), ("shard_grad_op", 3)):
        cfg = harness.config(strategy, world, micro_batches=1 if world == 3 else 2, **EIGHT_BIT)
        out, ranks = harness.run(cfg, world, extra_args=["--resume", step_dir])
        params = harness.load_params(out)
        name = f"resume at N={world} {strategy}"
        checks.check(ranks[0]["steps"][0]["step"] == save, f"{name} continues at step {save}")
        if world == 2:
            diff = max(float(np.max(np.abs(params[k] - two_params[k]))) for k in two_params)
            same = [s["loss"] for s in ranks[0]["steps"]] == [s["loss"] for s in two[0]["steps"]][save:]
            checks.check(diff == 0.0 and same, f"{name} is bitwise the uninterrupted run", f"max abs diff {diff:.2e}")
        else:
            within(checks, name, params, ref_params, [s["loss"] for s in ranks[0]["steps"]], ref_losses[save:],
                   loss_tol=REQUANTIZED_LOSS_TOL)


def bad_input(checks):
    try:
        harness.run(harness.config("no_shard", 1, optimizer__master_dtype="bf16", optimizer__moments_dtype="8bit"), 1)
        err = "accepted"
    except harness.RunError as e:
        err = str(e)
    expected = '[optimizer] master_dtype = "bf16" updates the parameters in place and needs [precision] param_dtype'
    checks.check(expected in err, "8-bit moments beside a bf16 master on fp32 parameters refused", err[-200:])


def main():
    checks = harness.Checks()
    against_bitsandbytes(checks)
    bf16_master_against_bitsandbytes(checks)
    ref_out, ref = harness.run(harness.config("no_shard", 1, **EIGHT_BIT), 1)
    ref_params = harness.load_params(ref_out)
    ref_losses = [s["loss"] for s in ref[0]["steps"]]
    mem = ref[0]["memory"]
    checks.check(mem["master"] == 0 and mem["optimizer"] == planned_optimizer_bytes(
        harness.config("no_shard", 1, **EIGHT_BIT), 1), "N=1: no master copy, the optimizer's bytes as planned",
        f"optimizer {mem['optimizer']} bytes")
    strategies(checks, ref_params, ref_losses)
    checkpoints(checks, ref_params, ref_losses)
    bad_input(checks)
    checks.finish()


if __name__ == "__main__":
    main()
