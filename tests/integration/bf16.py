"""Mixed precision: bf16 parameters with fp32 reduction, 10 steps at N=2 and 4
(full_shard, hybrid_shard, and hybrid_shard with its optimizer across the
replicas) against the single-process run in the same precision.

Tolerance. Compute runs in bf16 (8 significant bits, unit roundoff
u = 2^-8 ~ 3.9e-3); a different split of the batch over ranks and
micro-batches changes the CPU kernels' blocking and hence the rounding of
activations and per-rank gradients by O(u) relative. The fp32 master weights
only move by Adam updates, each at most ~lr per element, and rounding noise can
at worst flip the direction of an update whose gradient is near zero, so after
S steps a parameter can differ by at most ~2 * lr * S. We assert a tenth of
that, 0.2 * lr * S (1.2e-3 here), which still catches any real error (a wrong
reduction or a stale shard moves parameters by ~lr on every element every
step), and the losses within u/4 ~ 1e-3 relative (the loss is an fp32 mean over
every token of the batch, so per-logit rounding averages down).

One parameter is the exception: the key third of c_attn.bias. Softmax ignores
a constant added to every key's score, so its true gradient is exactly zero and
what the ranks compute is rounding noise of either sign; Adam normalises that
noise into full-size updates. It is held to the worst case, 2 * lr * S.
"""
import numpy as np

import harness

STEPS = 10


def main():
    checks = harness.Checks()
    prec = {"precision__param_dtype": "bf16", "precision__reduce_dtype": "fp32"}
    ref_out, ref = harness.run(harness.config("no_shard", 1, **prec), 1)
    lr = harness.TINY["optimizer"]["lr"]
    param_tol = 0.2 * lr * STEPS
    loss_tol = 2 ** -8 / 4
    ref_params = harness.load_params(ref_out)
    ref_losses = [s["loss"] for s in ref[0]["steps"]]
    # Sanity: bf16 really differs from fp32 (the setting took effect).
    fp32_out, _ = harness.run(harness.config("no_shard", 1), 1)
    fp32_params = harness.load_params(fp32_out)
    moved = max(float(np.max(np.abs(fp32_params[k] - ref_params[k]))) for k in ref_params)
    checks.check(moved > 0, "bf16 run differs from fp32", f"{moved:.2e}")
    # hybrid_shard also with its optimizer across the replicas: there the
    # fp32 master is a piece apart from the bf16 parameters' buffer.
    pieces = {"parallelism__shard_optimizer_across_replicas": True}
    for name, strategy, kw in (("full_shard", "full_shard", {}), ("hybrid_shard", "hybrid_shard", {}),
                               ("hybrid_shard (optimizer across replicas)", "hybrid_shard", pieces)):
        for world in (2, 4):
            out, ranks = harness.run(harness.config(strategy, world, **prec, **kw), world)
            params = harness.load_params(out)
            C = harness.TINY["model"]["n_embd"]
            key_bias = [k for k in ref_params if k.endswith("attn.c_attn.bias")]
            diff = max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params if k not in key_bias)
            for k in key_bias:  # q and v biases are ordinary parameters
                for part in (slice(0, C), slice(2 * C, 3 * C)):
                    diff = max(diff, float(np.max(np.abs(params[k][part] - ref_params[k][part]))))
            kdiff = max(float(np.max(np.abs(params[k][C:2 * C] - ref_params[k][C:2 * C]))) for k in key_bias)
            checks.check(kdiff <= 2 * lr * STEPS, f"bf16 {name} N={world} key bias (zero true gradient)",
                         f"max abs diff {kdiff:.3e} (tol {2 * lr * STEPS:.1e})")
            losses = [s["loss"] for s in ranks[0]["steps"]]
            rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            checks.check(diff <= param_tol, f"bf16 {name} N={world} params",
                         f"max abs diff {diff:.3e} (tol {param_tol:.1e})")
            checks.check(rel <= loss_tol, f"bf16 {name} N={world} losses",
                         f"max rel diff {rel:.3e} (tol {loss_tol:.1e})")
    checks.finish()


if __name__ == "__main__":
    main()
