"""Memory: at N=4 with bf16 parameters and gradients (docs/design.md's table), the
bytes each rank holds by kind (params, grads, master, optimizer) equal the
formulas up to padding, for every strategy; and the peak during a step stays
within the state plus the units allowed in flight plus activations. Keeping
the cheap ops' outputs ([memory] recompute_cheap_ops = false) changes no bit
of the run and raises the measured peak."""
import formulas
import harness

WORLD = 4


def main():
    checks = harness.Checks()
    shape = {"n_embd": 30, "n_head": 3, "vocab_size": 65, "n_layer": 2, "block_size": 16}
    checks.check(any(n % WORLD for n in formulas.unit_sizes(shape)), "unit sizes need padding at N=4")
    for strategy in harness.STRATEGIES:
        for ckpt in (False, True):
            cfg = harness.config(strategy, WORLD, micro_batches=1, precision__param_dtype="bf16",
                                 precision__reduce_dtype="bf16", train__steps=2,
                                 memory__activation_checkpointing=ckpt, model__n_embd=30,
                                 model__n_head=3, model__vocab_size=65)
            _, ranks = harness.run(cfg, WORLD)
            G = formulas.group_size(strategy, WORLD, cfg)
            sizes = formulas.unit_sizes(cfg["model"])
            P = sum(sizes)
            pad_allowance = 16 * sum(formulas.padded(n, G) - n for n in sizes)
            expected = formulas.state_bytes(cfg, WORLD)
            inflight = cfg["prefetch"]["max_inflight_all_gathers"]
            biggest = max(formulas.padded(n, G) for n in sizes)
            name = f"{strategy}{' +ckpt' if ckpt else ''}"
            for r in ranks:
                m = r["memory"]
                got = {k: m[k] for k in expected}
                if not ckpt:
                    checks.check(got == expected, f"{name} rank {r['rank']} bytes by kind",
                                 f"{got}" + ("" if got == expected else f" expected {expected}"))
                    table = formulas.design_table(strategy, P, WORLD, G)
                    checks.check(abs(m["state"] - table) <= pad_allowance,
                                 f"{name} rank {r['rank']} state vs docs/design.md's table",
                                 f"{m['state']} vs {table:.0f} (padding allowance {pad_allowance})")
                # Transient unsharded parameters: the pinned embed and head
                # units, the one being computed and the prefetched ones.
                extra_params = m["peak_params"] - m["params"]
                allowed = (3 + inflight) * biggest * 2
                checks.check(extra_params <= allowed, f"{name} rank {r['rank']} params in flight",
                             f"{extra_params} <= {allowed}")
                # Transient unsharded gradients never exceed one copy of the
                # model's gradients (and the reduce-dtype copies).
                extra_grads = m["peak_grads"] - m["grads"]
                checks.check(extra_grads <= sum(formulas.padded(n, G) for n in sizes) * 4,
                             f"{name} rank {r['rank']} grads in flight", f"{extra_grads}")
                # Initialisation builds one unit at a time: its shards plus the
                # unit being cut (its unsharded parameter and gradient buffers).
                init_allowed = m["state"] + biggest * (2 + 2)
                checks.check(m["init_peak"] <= init_allowed, f"{name} rank {r['rank']} init peak",
                             f"{m['init_peak']} <= {init_allowed}")
                bound = m["state"] + allowed + sum(formulas.padded(n, G) for n in sizes) * 4 + m["activation_peak"]
                checks.check(m["peak"] <= bound, f"{name} rank {r['rank']} step peak",
                             f"{m['peak']} <= {bound}")
    # Measured by the allocator: every tensor byte of a step, activations
    # included. It bounds the engine's ledger from above, and activation
    # checkpointing must lower it where activations dominate (long sequences, several blocks).
    peaks = {}
    for ckpt in (False, True):
        cfg = harness.config("full_shard", 2, micro_batches=1, train__steps=2, model__block_size=128, model__n_layer=6,
                             train__batch_size=8, train__micro_batch_size=4,
                             memory__activation_checkpointing=ckpt)
        _, ranks = harness.run(cfg, 2)
        m = ranks[0]["memory"]
        checks.check(m["tensor_peak"] >= m["peak"], f"allocator peak covers the ledger (ckpt={ckpt})",
                     f"{m['tensor_peak']} >= {m['peak']}")
        peaks[ckpt] = m["tensor_peak"]
    checks.check(peaks[True] < 0.8 * peaks[False], "activation checkpointing lowers the measured step peak",
                 f"{peaks[True]} vs {peaks[False]} bytes")
    check_recompute_cheap_ops(checks)
    # fp32: the master copy is the parameters themselves, never a duplicate.
    for strategy in harness.STRATEGIES:
        cfg = harness.config(strategy, WORLD, micro_batches=1, train__steps=1, model__n_embd=30,
                             model__n_head=3, model__vocab_size=65)
        _, ranks = harness.run(cfg, WORLD)
        expected = formulas.state_bytes(cfg, WORLD)
        got = {k: ranks[0]["memory"][k] for k in expected}
        checks.check(got == expected, f"{strategy} fp32 rank 0 bytes by kind",
                     f"{got}" + ("" if got == expected else f" expected {expected}"))
    checks.finish()


def check_recompute_cheap_ops(checks):
    """The GELU, SwiGLU and norm outputs computed again in backward or kept:
    the same losses and gradient norms bit for bit (GPT-2 in fp32 and bf16; a
    Qwen3-shaped llama, with per-head norms, in bf16: in fp32 its block input
    is its own fp32 copy, whose three gradient terms autograd may sum in
    another order, rms_norm.h), and a lower measured step peak where they
    are not kept."""
    models = [("gpt fp32", {}, "fp32"), ("gpt bf16", {}, "bf16"),
              ("qwen3 bf16", {"model": harness.llama_model("qwen3")}, "bf16")]
    for name, tables, dtype in models:
        runs = {}
        for recompute in (True, False):
            cfg = harness.config("full_shard", 2, micro_batches=1, train__steps=3, model__block_size=64,
                                 precision__param_dtype=dtype, memory__recompute_cheap_ops=recompute)
            cfg.update(tables)
            _, ranks = harness.run(cfg, 2)
            runs[recompute] = ([(s["loss"], s["grad_norm"]) for s in ranks[0]["steps"]],
                               ranks[0]["memory"]["tensor_peak"])
        checks.check(runs[True][0] == runs[False][0], f"{name}: recompute_cheap_ops changes no loss or norm bit",
                     f"{runs[True][0]} vs {runs[False][0]}")
        checks.check(runs[True][1] < runs[False][1], f"{name}: recomputing lowers the measured step peak",
                     f"{runs[True][1]} vs {runs[False][1]} bytes")


if __name__ == "__main__":
    main()
