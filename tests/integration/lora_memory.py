"""LoRA's memory and communication, against formulas.py at N=4 in bf16, for
every strategy and both placements of the frozen base ([lora] base):

  - bytes held by kind equal formulas.state_bytes exactly (the frozen base is
    params; grads, master and optimizer are the adapters' alone), and the
    state is formulas.lora_table's up to padding;
  - bytes sent by collective equal formulas.comm_bytes: a sharded base is
    all-gathered per use as full_shard does, a replicated one never moves,
    and only adapter gradients are reduced;
  - a replicated base holds N times the sharded one's parameter bytes and
    sends no base all-gathers, so the choice is the one the formulas state;
  - with [parallelism] sparse_embedding the sharded base's token table is
    looked up without being gathered (the bytes follow formulas.comm_bytes:
    an untied table is never gathered, GPT-2's tied one for its head alone:
    the tiny GPT's 64 words are fewer bytes than the group's hidden states,
    so its head gathers the table rather than computing over its shards,
    formulas.vocab_parallel_head) and every loss and parameter is the
    gathered table's, bit for bit;
  - at a vocabulary of 1024 the head computes over the frozen table's shards
    instead (fp32: the gathered head's losses and adapters within summation
    order, and the bytes of formulas.comm_bytes).
"""
import formulas
import harness

WORLD = 4


def lora_config(strategy, base, model="llama3"):
    cfg = harness.config(strategy, WORLD, micro_batches=2, precision__param_dtype="bf16",
                         precision__reduce_dtype="bf16", train__steps=2)
    targets = ["c_attn", "c_fc"]
    if model != "gpt":
        cfg["model"] = harness.llama_model(model)
        targets = ["q_proj", "v_proj", "down_proj"]
    cfg["lora"] = {"rank": 4, "alpha": 8, "target_modules": targets, "base": base}
    return cfg


def check_sparse_embedding(checks, model):
    """[parallelism] sparse_embedding under a sharded base: its rows come
    exactly (zeros added to every element but the owner's; GPT-2's position
    row added to its token row once, as the dense lookup adds them), so
    nothing a step computes changes, to the bit."""
    dense_out, dense = harness.run(lora_config("full_shard", "sharded", model), WORLD)
    cfg = lora_config("full_shard", "sharded", model)
    cfg["parallelism"]["sparse_embedding"] = True
    checks.check(not formulas.vocab_parallel_head(cfg, WORLD), f"{model}: the head gathers the table (bitwise case)")
    sparse_out, ranks = harness.run(cfg, WORLD)
    comm = formulas.comm_bytes(cfg, WORLD, cfg["train"]["steps"])
    got = {(c, op): ranks[0]["comm"][c][op]["bytes"] for (c, op) in comm}
    checks.check(got == comm and comm != formulas.comm_bytes(lora_config("full_shard", "sharded", model), WORLD, 2),
                 f"{model} full_shard base sharded, sparse embedding: bytes per collective",
                 "" if got == comm else f"got {got} expected {comm}")
    same = [s["loss"] for s in ranks[0]["steps"]] == [s["loss"] for s in dense[0]["steps"]]
    adapters_dense, adapters_sparse = harness.load_params(dense_out), harness.load_params(sparse_out)
    same = same and all((adapters_dense[k] == adapters_sparse[k]).all() for k in adapters_dense)
    checks.check(same, f"{model} full_shard base sharded: the sparse embedding's losses and parameters equal the "
                 "gathered table's, to the bit")


def check_vocab_parallel_head(checks, model):
    """At a vocabulary of 1024 the group's hidden states are the fewer bytes,
    so the head computes its loss over the frozen table's shards (GPT-2's
    tied wte; the llama's lm_head, whose frozen norm is exchanged once per
    run): the bytes follow formulas.comm_bytes, and the losses and adapters
    are the gathered head's within summation order (fp32: the head's
    statistics and dL/dh are summed over the ranks instead of in one
    matmul). Adam makes such a reordering at most steps * lr *
    REORDER_GRAD_REL apart in any parameter (harness.reorder_param_tol)."""
    def config(sparse):
        cfg = lora_config("full_shard", "sharded", model)
        cfg["precision"].update(param_dtype="fp32", reduce_dtype="fp32")
        cfg["model"]["vocab_size"] = 1024
        cfg["parallelism"]["sparse_embedding"] = sparse
        return cfg
    cfg = config(True)
    checks.check(formulas.vocab_parallel_head(cfg, WORLD), f"{model}: the head computes over the vocabulary")
    dense_out, dense = harness.run(config(False), WORLD)
    sparse_out, ranks = harness.run(cfg, WORLD)
    steps = cfg["train"]["steps"]
    comm = formulas.comm_bytes(cfg, WORLD, steps)
    for r in ranks:
        got = {(c, op): r["comm"][c][op]["bytes"] for (c, op) in comm}
        checks.check(got == comm, f"{model} LoRA, head over the vocabulary: rank {r['rank']} bytes per collective",
                     "" if got == comm else f"got {got} expected {comm}")
    losses = [(s["loss"], d["loss"]) for s, d in zip(ranks[0]["steps"], dense[0]["steps"])]
    rel = max(abs(a - b) / abs(b) for a, b in losses)
    checks.check(len(losses) == steps and rel <= 1e-6, f"{model} LoRA, head over the vocabulary: losses",
                 f"max rel diff {rel:.3e} (tol 1e-6)")
    tol = harness.reorder_param_tol(cfg["optimizer"]["lr"], steps)
    diff, _ = harness.param_diffs(harness.load_params(sparse_out), harness.load_params(dense_out))
    checks.check(diff <= tol, f"{model} LoRA, head over the vocabulary: adapters",
                 f"max abs diff {diff:.3e} (tol {tol:.1e})")


def main():
    checks = harness.Checks()
    sent = {}
    for strategy in harness.STRATEGIES:
        for base in ("sharded", "replicated"):
            cfg = lora_config(strategy, base)
            _, ranks = harness.run(cfg, WORLD)
            G = formulas.group_size(strategy, WORLD, cfg)
            name = f"{strategy} base {base}"
            expected = formulas.state_bytes(cfg, WORLD)
            comm = formulas.comm_bytes(cfg, WORLD, cfg["train"]["steps"])
            P_base, P_adapters = sum(formulas.unit_sizes(cfg["model"])), sum(formulas.adapter_sizes(cfg))
            pad = 16 * sum(formulas.padded(n, G) - n for n in formulas.adapter_sizes(cfg) + formulas.unit_sizes(cfg["model"]))
            table = formulas.lora_table(strategy, base, P_base, P_adapters, WORLD, G)
            for r in ranks:
                m = r["memory"]
                got = {k: m[k] for k in expected}
                checks.check(got == expected, f"{name} rank {r['rank']} bytes by kind",
                             f"{got}" + ("" if got == expected else f" expected {expected}"))
                checks.check(abs(m["state"] - table) <= pad, f"{name} rank {r['rank']} state vs the LoRA table",
                             f"{m['state']} vs {table:.0f}")
                got = {(c, op): r["comm"][c][op]["bytes"] for (c, op) in comm}
                checks.check(got == comm, f"{name} rank {r['rank']} bytes per collective",
                             "" if got == comm else f"got {got} expected {comm}")
                trained = m["grads"] + m["master"] + m["optimizer"]
                bound = 14 * sum(formulas.padded(n, G) for n in formulas.adapter_sizes(cfg))
                checks.check(trained <= bound, f"{name} rank {r['rank']}: no gradient, master or Adam state for the base",
                             f"{trained} <= {bound} (14 bytes per adapter parameter)")
            sent[(strategy, base)] = ranks[0]["comm"]["shard"]["all_gather"]["bytes"]
    for model in ("llama3", "gpt"):
        check_sparse_embedding(checks, model)
        check_vocab_parallel_head(checks, model)
    base_gathers = sent[("full_shard", "sharded")] - sent[("full_shard", "replicated")]
    checks.check(base_gathers > 5 * sent[("full_shard", "replicated")],
                 "full_shard: the sharded base's all-gathers dominate what a replicated base sends",
                 f"{sent[('full_shard', 'sharded')]} vs {sent[('full_shard', 'replicated')]} bytes")
    checks.finish()


if __name__ == "__main__":
    main()
