"""Sharded checkpoints in the engine: 20 steps uninterrupted at N=4
(full_shard, fp32) against 10 steps, save, and a resume:
  - at N=4 with full_shard: bitwise equal parameters at step 20;
  - at N=3 with shard_grad_op, N=2 with hybrid_shard, N=1 with no_shard
    and N=4 with hybrid_shard's optimizer sharded across its replicas
    (each rank loads its piece): within the engine's equivalence tolerance
    (2e-5), the loss curve continuing (losses of steps 10..19 within 1e-6
    relative);
  - and from a checkpoint that such a run saved (10 steps of hybrid_shard
    at N=4 in pieces), at N=2 with full_shard, likewise.
Bad input: a directory without a manifest, another model's checkpoint, and a
flipped byte in a shard are refused with errors naming the directory or file,
and nothing is deleted."""
import os
import subprocess

import numpy as np

import harness

STEPS, SAVE = 20, 10


def ranks_run(cfg, world, extra, expect_ok=True):
    try:
        return harness.run(cfg, world, extra_args=extra)
    except harness.RunError as e:
        if expect_ok:
            raise
        return None, str(e)


def main():
    checks = harness.Checks()
    base = harness.config("full_shard", 4, train__steps=STEPS)
    ref_out, ref = harness.run(base, 4)
    ref_params = harness.load_params(ref_out)
    ref_losses = [s["loss"] for s in ref[0]["steps"]]

    ckpt = harness.scratch_dir("shardline-ckpt-")
    _, first = harness.run(base, 4, extra_args=["--ckpt-dir", ckpt, "--save-at", str(SAVE),
                                                "--stop-after", str(SAVE)])
    step_dir = os.path.join(ckpt, "tiny", "step-%08d" % SAVE)
    files = sorted(os.listdir(step_dir))
    checks.check(files == ["manifest.json"] + [f"rank-{r:05d}.safetensors" for r in range(4)],
                 "a committed checkpoint: 4 shard files and the manifest", str(files))
    checks.check([s["loss"] for s in first[0]["steps"]] == ref_losses[:SAVE], "the first 10 steps are the same run")

    # A run whose optimizer is sharded across its replicas ([parallelism]
    # shard_optimizer_across_replicas; hybrid_shard at N=4: 2 groups of 2)
    # saves its pieces gathered into the shard group's files.
    pieces_ckpt = harness.scratch_dir("shardline-ckpt-pieces-")
    pieces = {"parallelism__shard_optimizer_across_replicas": True}
    harness.run(harness.config("hybrid_shard", 4, train__steps=STEPS, **pieces), 4,
                extra_args=["--ckpt-dir", pieces_ckpt, "--save-at", str(SAVE), "--stop-after", str(SAVE)])
    pieces_dir = os.path.join(pieces_ckpt, "tiny", "step-%08d" % SAVE)

    for strategy, world, src, kw in (("full_shard", 4, step_dir, {}), ("shard_grad_op", 3, step_dir, {}),
                                     ("hybrid_shard", 2, step_dir, {}), ("no_shard", 1, step_dir, {}),
                                     ("hybrid_shard", 4, step_dir, pieces), ("full_shard", 2, pieces_dir, {})):
        cfg = harness.config(strategy, world, train__steps=STEPS, **kw)
        out, ranks = harness.run(cfg, world, extra_args=["--resume", src])
        params = harness.load_params(out)
        diff = max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params)
        losses = [s["loss"] for s in ranks[0]["steps"]]
        rel = max(abs(a - b) / b for a, b in zip(losses, ref_losses[SAVE:]))
        name = f"resume at N={world} {strategy}" + (" (optimizer across replicas)" if kw else "") + (
            " from a run with its optimizer across replicas" if src == pieces_dir else "")
        checks.check(len(losses) == STEPS - SAVE and ranks[0]["steps"][0]["step"] == SAVE,
                     f"{name} continues at step {SAVE}")
        if (strategy, world, src) == ("full_shard", 4, step_dir):
            checks.check(diff == 0.0, f"{name} is bitwise equal at step 20", f"max abs diff {diff:.3e}")
        else:
            checks.check(diff <= 2e-5, f"{name} params", f"max abs diff {diff:.3e}")
        checks.check(rel <= 1e-6, f"{name} loss curve continues", f"max rel diff {rel:.3e}")

    # Bad input.
    _, err = ranks_run(harness.config("full_shard", 1, train__steps=STEPS), 1, ["--resume", ckpt], expect_ok=False)
    checks.check("no manifest.json: not a committed checkpoint" in err and ckpt in err, "no manifest refused",
                 err[-120:])
    other = harness.config("full_shard", 1, train__steps=STEPS, model__n_embd=48)
    _, err = ranks_run(other, 1, ["--resume", step_dir], expect_ok=False)
    checks.check("checkpoint of another model: n_embd = 32 there, 48 in the job" in err, "another model refused",
                 err[-120:])
    victim = os.path.join(step_dir, "rank-00002.safetensors")
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    _, err = ranks_run(harness.config("full_shard", 2, train__steps=STEPS), 2, ["--resume", step_dir],
                       expect_ok=False)
    checks.check("rank-00002.safetensors: checksum mismatch" in err, "a flipped byte is a checksum error naming the file",
                 err[-160:])
    checks.check(sorted(os.listdir(step_dir)) == files, "nothing was deleted")
    checks.finish()


if __name__ == "__main__":
    main()
