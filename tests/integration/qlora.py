"""QLoRA's NF4 base ([lora] base_dtype = "nf4") at every strategy family.

The tiny llama with LoRA on every projection and its blocks' matrices in NF4:
1. ten steps at N=1 (no_shard), N=2 (full_shard, the base sharded by
   blocks), N=3 (full_shard, the base replicated), N=4 (hybrid_shard): every
   run's losses equal N=1's within 1e-5 relative (the same dequantized
   weights on every rank, bitwise, so only the reductions' order differs,
   as in equivalence.py's fp32 runs) and its adapters within 2e-5;
2. the NF4 base is not the dense base: step 0's loss moves off the dense
   run's (by the 4 bits' error), but by less than 1% (NF4's relative error
   per weight is about 1/16 of the block's absmax).
"""
import harness

STEPS = 10


def job(strategy, world, base_dtype, base="sharded"):
    cfg = harness.config(strategy, world, micro_batches=2, train__steps=STEPS)
    cfg["model"] = {"family": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 128,
                    "intermediate_size": 192, "vocab_size": 256, "block_size": 16}
    cfg["optimizer"]["lr"] = 3e-3
    cfg["lora"] = {"rank": 4, "alpha": 8, "target_modules": "all-linear", "base": base, "base_dtype": base_dtype}
    return cfg


def run(cfg, world):
    out, ranks = harness.run(cfg, world)
    return [s["loss"] for s in ranks[0]["steps"]], harness.load_params(out)


def main():
    checks = harness.Checks()
    ref_losses, ref = run(job("no_shard", 1, "nf4"), 1)
    for strategy, world, base in (("full_shard", 2, "sharded"), ("full_shard", 3, "replicated"),
                                  ("hybrid_shard", 4, "sharded")):
        losses, params = run(job(strategy, world, "nf4", base), world)
        label = f"nf4 base: {strategy} N={world} base {base} vs N=1"
        lrel = max(abs(a - b) / b for a, b in zip(losses, ref_losses))
        checks.check(len(losses) == STEPS and lrel < 1e-5, f"{label}: losses", f"max rel diff {lrel:.2e}")
        diff = max(float(abs(params[k] - ref[k]).max()) for k in ref)
        checks.check(diff < 2e-5, f"{label}: adapters", f"max abs diff {diff:.2e}")
    dense, _ = run(job("no_shard", 1, "param_dtype"), 1)
    rel = abs(dense[0] - ref_losses[0]) / dense[0]
    checks.check(0 < rel < 1e-2, "nf4 base: step 0's loss is near the dense base's, not equal", f"rel diff {rel:.2e}")
    checks.finish()


if __name__ == "__main__":
    main()
