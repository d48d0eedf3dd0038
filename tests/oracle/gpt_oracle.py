"""Oracle: the engine against PyTorch on the same weights and batch.

1. One process, step 0 (2 micro-batches, so accumulation is in the path):
   logits, loss and every gradient of the engine match the nanoGPT-style model
   in fp32 (max relative error, normwise, reported).
2. Ten steps: PyTorch trains the same model with torch.optim.AdamW (weight
   decay on 2-D tensors only), clip_grad_norm_ and the warmup+cosine schedule
   on the engine's batches; the engine's final parameters (one process, and 4
   ranks with full_shard) match.
"""
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import harness  # noqa: E402
from nanogpt import model_from, train_reference  # noqa: E402
from step0 import check_step0  # noqa: E402

torch.set_num_threads(1)


def main():
    checks = harness.Checks()
    for ckpt in (False, True):
        tag = " +ckpt" if ckpt else ""
        cfg = harness.config("no_shard", 1, micro_batches=2, memory__activation_checkpointing=ckpt)
        dump = harness.step0_dump(cfg, "shardline-oracle-")
        m = cfg["model"]
        model = model_from(dump, m)
        logits, loss = model(dump["batch.inputs"], dump["batch.targets"])
        check_step0(checks, dump, model, logits, loss, f"step 0{tag}: ")

    # Ten steps of training against torch.optim.AdamW.
    ref, torch_losses = train_reference(dump, cfg)
    for strategy, world in (("no_shard", 1), ("full_shard", 4)):
        c = harness.config(strategy, world, micro_batches=2)
        run_out, ranks = harness.run(c, world)
        params = load_file(os.path.join(run_out, "params.safetensors"))
        diff = max(float((params[k] - ref[k]).abs().max()) for k in params)
        losses = [s["loss"] for s in ranks[0]["steps"]]
        lrel = max(abs(a - b) / b for a, b in zip(losses, torch_losses))
        checks.check(diff < 2e-5, f"10 steps vs torch AdamW: {strategy} N={world} params", f"max abs diff {diff:.2e}")
        checks.check(lrel < 1e-5, f"10 steps vs torch AdamW: {strategy} N={world} losses", f"max rel diff {lrel:.2e}")
    checks.finish()


if __name__ == "__main__":
    main()
