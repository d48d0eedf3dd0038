"""docs/design.md's memory and communication formulas, computed independently of
the engine from the unit sizes alone (the ShardLayout rule: pad each unit to a
multiple of the shard group size)."""

SHARDS_PARAMS = {"full_shard", "hybrid_shard"}
SHARDS_GRADS = {"shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2"}
DTYPE_BYTES = {"fp32": 4, "bf16": 2}


def unit_sizes(model):
    """Parameter count of each unit: embed (wte, wpe), blocks, head (ln_f);
    for the llama family embed_tokens, layers, head (norm, lm_head unless tied)."""
    C, V, T, L = model["n_embd"], model["vocab_size"], model["block_size"], model["n_layer"]
    if model.get("family") == "llama":
        H, KV, I = model["n_head"], model.get("n_kv_head") or model["n_head"], model["intermediate_size"]
        D = model.get("head_dim") or C // H
        layer = 2 * C + (H + 2 * KV) * D * C + C * H * D + 3 * I * C
        layer += (H + 2 * KV) * D if model.get("qkv_bias") else 0
        layer += 2 * D if model.get("qk_norm") else 0
        return [V * C] + [layer] * L + [C + (0 if model.get("tie_word_embeddings") else V * C)]
    block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C
    return [V * C + T * C] + [block] * L + [2 * C]


LORA_MODULES = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                "gpt2": ["c_attn", "c_proj", "c_fc"]}


def adapter_sizes(cfg):
    """Under [lora]: the adapters of each block, r * (in + out) per adapted
    projection (GPT-2's c_proj names both the attention's and the MLP's)."""
    model, lora = cfg["model"], cfg["lora"]
    C, r = model["n_embd"], lora.get("rank", 8)
    if model.get("family") == "llama":
        H, KV, I = model["n_head"], model.get("n_kv_head") or model["n_head"], model["intermediate_size"]
        D = model.get("head_dim") or C // H
        shapes = {"q_proj": [(C, H * D)], "k_proj": [(C, KV * D)], "v_proj": [(C, KV * D)], "o_proj": [(H * D, C)],
                  "gate_proj": [(C, I)], "up_proj": [(C, I)], "down_proj": [(I, C)]}
        default = ["q_proj", "v_proj"]
    else:
        shapes = {"c_attn": [(C, 3 * C)], "c_proj": [(C, C), (4 * C, C)], "c_fc": [(C, 4 * C)]}
        default = ["c_attn"]
    family = "llama" if model.get("family") == "llama" else "gpt2"
    targets = lora.get("target_modules") or default
    targets = LORA_MODULES[family] if targets == "all-linear" else targets
    if isinstance(targets, str):
        targets = [targets]
    block = sum(r * (i + o) for t in targets for (i, o) in shapes[t])
    return [block] * model["n_layer"]


def padded(n, g):
    return (n + g - 1) // g * g


def group_size(strategy, world, cfg):
    if strategy == "no_shard":
        return 1
    if strategy.startswith("hybrid"):
        return cfg["parallelism"].get("shard_group_size", world) or world
    return world


def ring(full_bytes, n):
    return full_bytes // n * (n - 1)


def ring_all_reduce(nbytes, elem, n):
    elems = nbytes // elem
    return 2 * ring(padded(elems, n) * elem, n)


def gathers_per_micro(sizes, elem, G, blocks_only=False):
    """All-gather bytes of one micro-batch where parameters stay sharded:
    blocks are gathered in forward and again in backward, but the last,
    which stays gathered from its forward to its backward; embed and head
    once. `blocks_only`: `sizes` are the blocks' alone."""
    if not blocks_only:
        return ring(sizes[0] * elem, G) + ring(sizes[-1] * elem, G) + gathers_per_micro(sizes[1:-1], elem, G, True)
    return sum(ring(s * elem, G) * (2 if i < len(sizes) - 1 else 1) for i, s in enumerate(sizes))


def sparse_embedding(cfg, world):
    """[parallelism] sparse_embedding applies: a token table whose parameters
    stay sharded, over a shard group of more than one rank."""
    strategy = cfg["parallelism"]["strategy"]
    sharded = strategy in SHARDS_PARAMS or (bool(cfg.get("lora")) and cfg["lora"].get("base", "sharded") == "sharded")
    return bool(cfg["parallelism"].get("sparse_embedding")) and sharded and group_size(strategy, world, cfg) > 1


def tied(model):
    return model.get("family") != "llama" or bool(model.get("tie_word_embeddings"))


def vocab_parallel_head(cfg, world):
    """The head computes its loss over the vocabulary table's shards (GPT-2's
    tied wte in the embed unit, the llama's lm_head in the head unit) where
    that moves fewer bytes than gathering the unit that holds the table (and
    reduce-scattering its gradient where it trains):
    comm::VocabParallelBeatsGather, as the engine and the planner decide."""
    model = cfg["model"]
    if not sparse_embedding(cfg, world):
        return False
    G = group_size(cfg["parallelism"]["strategy"], world, cfg)
    p = DTYPE_BYTES[cfg["precision"]["param_dtype"]]
    r = DTYPE_BYTES[cfg["precision"]["reduce_dtype"]]
    rows = G * cfg["train"]["micro_batch_size"] * model["block_size"]
    holder = padded(unit_sizes(model)[0 if tied(model) else -1], G)
    return rows * model["n_embd"] * (p + r) < holder * (p + (0 if cfg.get("lora") else r))


def cut_rows(model, G, R=1):
    """Rows of the vocabulary table (wte, first in the embed unit; untied,
    lm_head, after the norm's C in the head unit) that a shard boundary of
    their unit falls inside; over the world (R replicas), a boundary of the
    shards' R parts (TableShard::PartOf)."""
    C, V = model["n_embd"], model["vocab_size"]
    offset = 0 if tied(model) else C
    shard = padded(unit_sizes(model)[0 if tied(model) else -1], G) // G
    part = -(-shard // R)
    bounds = {s * shard + min(r * part, shard) for s in range(G) for r in range(R)}
    return len({(b - offset) // C for b in bounds if offset < b < offset + V * C and (b - offset) % C})


def head_over_world(cfg, world):
    """The head computes over every rank's tokens, each rank over its
    replica's part of its shard, where the table trains (tied, its rows'
    gradients crossing the replicas already) and the hidden states and
    their gradients crossing them are fewer bytes than the half of the
    shard's all-reduce it saves (comm::HeadOverWorldBeatsAllReduce, as the
    engine and the planner decide)."""
    model = cfg["model"]
    if not vocab_parallel_head(cfg, world) or cfg.get("lora"):
        return False
    G = group_size(cfg["parallelism"]["strategy"], world, cfg)
    R = world // G
    p = DTYPE_BYTES[cfg["precision"]["param_dtype"]]
    r = DTYPE_BYTES[cfg["precision"]["reduce_dtype"]]
    tokens, C = cfg["train"]["micro_batch_size"] * model["block_size"], model["n_embd"]
    micro = cfg["train"]["batch_size"] // world // cfg["train"]["micro_batch_size"]
    table = padded(unit_sizes(model)[0], G) // G
    world_rows = R > 1 and R * G * tokens * C < 2 * table
    shard = padded(unit_sizes(model)[0 if tied(model) else -1], G) // G
    return R > 1 and (world_rows or not tied(model)) and R * micro * tokens * C * (p + r) < shard * r


def optimizer_pieces(cfg, world):
    """Indices (into comm_bytes' `sizes`) of the units whose optimizer is
    sharded across the replicas ([parallelism]
    shard_optimizer_across_replicas under hybrid_shard with replicas): all
    but those the sparse embedding trains (the embed unit and the head)."""
    strategy = cfg["parallelism"]["strategy"]
    G = group_size(strategy, world, cfg)
    if not (cfg["parallelism"].get("shard_optimizer_across_replicas") and strategy == "hybrid_shard" and world > G):
        return set()
    n = len(adapter_sizes(cfg)) if cfg.get("lora") else len(unit_sizes(cfg["model"]))
    skip = {0, n - 1} if sparse_embedding(cfg, world) and not cfg.get("lora") else set()
    return set(range(n)) - skip


def comm_bytes(cfg, world, steps):
    """Bytes this rank sends, by (communicator, op), over `steps` steps plus
    the final parameter gather that shardline-train --out performs. Under
    [lora] the trained units are the blocks' adapters; a sharded frozen base
    is gathered as full_shard gathers its units, a replicated one never."""
    strategy = cfg["parallelism"]["strategy"]
    G = group_size(strategy, world, cfg)
    R = world // G
    p = DTYPE_BYTES[cfg["precision"]["param_dtype"]]
    r = DTYPE_BYTES[cfg["precision"]["reduce_dtype"]]
    lora = bool(cfg.get("lora"))
    sizes = [padded(n, G) for n in (adapter_sizes(cfg) if lora else unit_sizes(cfg["model"]))]
    micro = cfg["train"]["batch_size"] // world // cfg["train"]["micro_batch_size"]
    ag = 0
    if strategy in SHARDS_PARAMS:
        ag = micro * gathers_per_micro(sizes, p, G, blocks_only=lora)
    elif G > 1:
        ag = sum(ring(s * p, G) for s in sizes)  # updated parameters after the optimizer
    if lora and cfg["lora"].get("base", "sharded") == "sharded":
        ag += micro * gathers_per_micro([padded(n, G) for n in unit_sizes(cfg["model"])], p, G)
    rs = sum(ring(s * r, G) for s in sizes)
    rep_ag = rep_rs = rep_ar_table = rep_ar_prefix = head_ar = head_ar_once = 0  # (sparse embedding, below)
    # Sharded accumulation (the default where gradients are sharded): every
    # micro-batch is reduce-scattered; the all-reduce across replicas is once.
    if strategy in SHARDS_GRADS and cfg["train"].get("grad_accumulation", "sharded") == "sharded":
        rs *= micro
    if sparse_embedding(cfg, world):
        # Per micro-batch the ids (int64: tokens, and GPT-2's positions) are
        # all-gathered and the [G x tokens, C] partial rows reduce-scattered,
        # and in backward the rows' gradients (reduce dtype) all-gathered.
        # An untied table is then never gathered nor reduce-scattered; a tied
        # one is, for the head, unless the head computes over its shards.
        model = cfg["model"]
        tokens, C = cfg["train"]["micro_batch_size"] * model["block_size"], model["n_embd"]
        tables = 1 if model.get("family") == "llama" else 2
        table = padded(unit_sizes(model)[0], G)
        if not tied(model):
            ag -= micro * ring(table * p, G)
        if vocab_parallel_head(cfg, world):
            # The head's loss over the table's shards (VocabParallelHead):
            # per micro-batch the group's hidden states (param dtype),
            # targets (int64) and [G x tokens, 2 + cut rows] fp32 statistics
            # are all-gathered and dL/dh (reduce dtype) reduce-scattered,
            # instead of the gather of the unit holding the table and its
            # gradient's reduce-scatter. Untied, the head unit's norm before
            # the table is all-reduced from its owner instead (param dtype),
            # once per step (once per run where it is frozen: head_ar_once),
            # and its gradient likewise (reduce dtype), every micro-batch.
            holder = padded(unit_sizes(model)[0 if tied(model) else -1], G)
            if head_over_world(cfg, world):
                # Over the world: every rank's hidden states, targets and
                # statistics are gathered across the replicas (each rank's
                # own) and then over the shard group (R ranks' each); dL/dh
                # is reduce-scattered over the shard group, then across the
                # replicas. Once per step the replicas all-gather their
                # parts of the table's gradient (padded to the largest),
                # and the shard of the unit holding the table is never
                # all-reduced; untied, the norm's gradient (summed over the
                # group every micro-batch) is all-reduced across them once.
                rows, stats = R * G * tokens, 2 + cut_rows(model, G, R)
                ag += micro * (ring(rows * C * p, G) + ring(rows * 8, G) + ring(R * G * rows * stats * 4, G)
                               - ring(holder * p, G))
                rs += micro * ring(rows * C * r, G)
                rep_ag += micro * (ring(R * tokens * C * p, R) + ring(R * tokens * 8, R) + ring(R * rows * stats * 4, R))
                rep_ag += ring(R * -(-(holder // G) // R) * r, R)
                rep_rs += micro * ring(R * tokens * C * r, R)
                rep_ar_table += ring_all_reduce(holder // G * r, r, R)
                if not tied(model):
                    rep_ar_prefix = ring_all_reduce(C * r, r, R)
            else:
                rows = G * tokens
                ag += micro * (ring(rows * C * p, G) + ring(rows * 8, G) + ring(G * rows * (2 + cut_rows(model, G)) * 4, G)
                               - ring(holder * p, G))
                rs += micro * ring(rows * C * r, G)
            if not lora:
                rs -= (micro if cfg["train"].get("grad_accumulation", "sharded") == "sharded" else 1) * ring(holder * r, G)
            if not tied(model):
                if lora:
                    head_ar_once = ring_all_reduce(C * p, p, G)
                else:
                    head_ar = ring_all_reduce(C * p, p, G) + micro * ring_all_reduce(C * r, r, G)
        ag += micro * ring(G * tokens * 8 * tables, G)
        rs += micro * ring(G * tokens * C * p, G)
        if not lora:
            if not tied(model):
                rs -= (micro if cfg["train"].get("grad_accumulation", "sharded") == "sharded" else 1) * ring(table * r, G)
            ag += micro * ring(G * tokens * C * r, G)
            # Across R replicas, where every replica's rows are fewer bytes
            # than the shard's all-reduce (SparseEmbedding::RowsBeatAllReduce),
            # the rows' gradients and ids are gathered across them too: in
            # every micro-batch for an untied table, whose shard is then never
            # all-reduced; in the last for a tied one, after the head's part
            # was, unless the head computes over the world (every one).
            if R > 1 and R * G * tokens * C < 2 * (table // G):
                gathers = micro if not tied(model) or head_over_world(cfg, world) else 1
                rep_ag += gathers * (ring(R * G * tokens * C * r, R) + ring(R * G * tables * tokens * 8, R))
                if not tied(model):
                    rep_ar_table += ring_all_reduce(table // G * r, r, R)
    # The first block stays gathered from a micro-batch's backward into the
    # next one's forward (Engine::ReshardAfterBackward): one gather of it
    # fewer per micro-batch after the first. A frozen base (LoRA's) stays from
    # a step into the next too, but for a run's last step.
    base_sizes = [padded(n, G) for n in unit_sizes(cfg["model"])]
    first_block_once = 0
    if len(base_sizes) > 2:
        if strategy in SHARDS_PARAMS:
            ag -= (micro - 1) * ring(sizes[0 if lora else 1] * p, G)
        if lora and cfg["lora"].get("base", "sharded") == "sharded":
            ag -= (micro - 1) * ring(base_sizes[1] * p, G)
            first_block_once = -(steps - 1) * ring(base_sizes[1] * p, G)
    # Units whose optimizer is sharded across the replicas reduce-scatter
    # their shard across them (in R pieces of ceil(shard / R)) instead of
    # all-reducing it, and all-gather the updated pieces (param dtype) once
    # a step and before the final gather (fp32 master); the step's sums
    # then carry the pieces' squares across the replicas too.
    pieces = optimizer_pieces(cfg, world)
    piece = {i: -(-(sizes[i] // G) // R) for i in pieces}
    # the step's sums in one (fp64): grad norm, loss, save vote (and the
    # pieces' squares); across the replicas all but the first
    shard_ar = ring_all_reduce(32 if pieces else 24, 8, G) if G > 1 else 0
    rep_ar = (sum(ring_all_reduce(s // G * r, r, R) for i, s in enumerate(sizes) if i not in pieces)
              + ring_all_reduce(24 if pieces else 16, 8, R)) if R > 1 else 0
    rep_rs += sum(ring(R * c * r, R) for c in piece.values())
    rep_ag += sum(ring(R * c * p, R) for c in piece.values())
    final_gather = sum(ring(s * 4, G) for s in sizes)
    final_rep_gather = sum(ring(R * c * 4, R) for c in piece.values())
    counts = {
        ("shard", "all_gather"): steps * ag + first_block_once + final_gather,
        ("shard", "reduce_scatter"): steps * rs,
        ("shard", "all_reduce"): steps * (shard_ar + head_ar) + head_ar_once,
        ("replicate", "all_reduce"): steps * (rep_ar - rep_ar_table + rep_ar_prefix),
    }
    if rep_ag:
        counts[("replicate", "all_gather")] = steps * rep_ag + final_rep_gather
    if rep_rs:
        counts[("replicate", "reduce_scatter")] = steps * rep_rs
    return counts


def state_bytes(cfg, world):
    """Per-rank bytes by kind at rest, with the engine's exact padding. Under
    [lora]: the frozen base in the param dtype (its shard, or all of it when
    replicated) plus the adapters' state as the strategy keeps any unit's."""
    strategy = cfg["parallelism"]["strategy"]
    G = group_size(strategy, world, cfg)
    p = DTYPE_BYTES[cfg["precision"]["param_dtype"]]
    r = DTYPE_BYTES[cfg["precision"]["reduce_dtype"]]
    if cfg.get("lora"):
        base = unit_sizes(cfg["model"])
        frozen = (p * sum(padded(n, G) for n in base) // G if cfg["lora"].get("base", "sharded") == "sharded"
                  else p * sum(base))
        adapters = state_bytes({**cfg, "lora": None, "adapters": adapter_sizes(cfg)}, world)
        return {**adapters, "params": adapters["params"] + frozen}
    sizes = [padded(n, G) for n in cfg.get("adapters") or unit_sizes(cfg["model"])]
    full = sum(sizes)
    shard = full // G
    opt = cfg.get("optimizer", {})
    mb = DTYPE_BYTES[opt.get("master_dtype", "fp32")]
    if opt.get("moments_dtype", "fp32") not in DTYPE_BYTES:
        raise ValueError("8-bit moments: their bytes are per tensor and block (shardctl plan counts them)")
    ob = DTYPE_BYTES[opt.get("moments_dtype", "fp32")]
    params = p * (shard if strategy in SHARDS_PARAMS else full)
    if mb == p and strategy in SHARDS_PARAMS:
        params = 0  # the parameter shard is the master itself (counted there)
    grads = r * shard if strategy in SHARDS_GRADS else max(p * full, 0)
    if strategy not in SHARDS_GRADS and r != p:
        grads += r * shard
    # A master of the parameters' dtype is the parameters themselves (no duplicate).
    master = 0 if mb == p and strategy not in SHARDS_PARAMS else mb * shard
    return {"params": params, "grads": grads, "master": master, "optimizer": 2 * ob * shard}


def lora_table(strategy, base, P_base, P_adapters, N, G):
    """The LoRA state per rank (bf16 params and grads, fp32 master and Adam on
    the adapters): the frozen base, 2 P_base / G sharded over the shard group
    or 2 P_base replicated, plus the strategy's row of design_table for the
    adapters."""
    return (2 * P_base / G if base == "sharded" else 2 * P_base) + design_table(strategy, P_adapters, N, G)


def design_table(strategy, P, N, G):
    """docs/design.md's table (bf16 params and grads, fp32 master and Adam)."""
    return {
        "no_shard": 16 * P,
        "zero1": 4 * P + 12 * P / N,
        "shard_grad_op": 2 * P + 14 * P / N,
        "full_shard": 16 * P / N,
        "hybrid_shard": 16 * P / G,
        "hybrid_shard_zero2": 2 * P + 14 * P / G,
    }[strategy]
