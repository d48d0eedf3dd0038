"""Shardline against PyTorch, side by side, in one run and one table.

The same GPT (bench/engine_bench.py's small GPT: 6 layers, width 512, block
256, vocab 16384), the same tokens (an llm.c .bin file of seeded random tokens
both sides read in docs/design.md's order), the same global batch, steps, AdamW,
schedule and clipping, at N = 1, 2, 4 ranks on CPU over Gloo with equal
intra-op threads per rank. Shardline runs every strategy; PyTorch (the venv's
torch) runs its matching one:

    no_shard            DDP
    zero1               DDP + ZeroRedundancyOptimizer(AdamW)
    shard_grad_op       FSDP2 fully_shard(reshard_after_forward=False)
    full_shard          FSDP2 fully_shard(reshard_after_forward=True)
    hybrid_shard        FSDP2 on a 2-D (replicate, shard) mesh (HSDP)
    hybrid_shard_zero2  HSDP with reshard_after_forward=False

Columns: tokens/s (the first step is a warm-up and left out), Shardline's
ratio to PyTorch, peak RSS per rank (the largest rank's), final loss.

`--model llama100m` runs full fine-tuning of a ~100M-parameter Llama-style
model instead (LLAMA_100M: GQA 12:4, SwiGLU, untied head): Shardline's llama
family against transformers' LlamaForCausalLM (SDPA attention) under the same
PyTorch wrappers, FSDP2 sharding each decoder layer.

`--lora R` fine-tunes rank-R adapters (alpha 2R) on every projection of a
frozen base instead: Shardline's [lora] (base sharded) against PEFT's
get_peft_model on the same model under the same wrappers (FSDP2 then shards
each decoder layer's frozen and trainable parameters alike), AdamW over the
adapters only.

    .venv/bin/python bench/torch_compare.py [--model gpt|llama100m] [--steps 5] [--worlds 1,2,4]
                                            [--strategies a,b] [--batch 8] [--seq T] [--lora R]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))

import harness  # noqa: E402

SMALL_GPT = harness.SMALL_GPT
# ~100M parameters (99.4M): 8 layers of width 768, 12 heads over 4 key/value
# heads, SwiGLU 2048, Llama 2's 32000 vocabulary, untied.
LLAMA_100M = {"family": "llama", "n_layer": 8, "n_head": 12, "n_kv_head": 4, "n_embd": 768,
              "intermediate_size": 2048, "vocab_size": 32000, "block_size": 256, "rope_theta": 10000.0,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False}



def peak_rss():
    """This process's peak resident bytes: VmHWM, which exec resets (getrusage's
    ru_maxrss carries the parent's peak into a child it started)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0

def model_config(name, seq):
    m = dict(SMALL_GPT if name == "gpt" else LLAMA_100M)
    if seq:
        m["block_size"] = seq
    return m


def torch_model(name, m):
    """(model, blocks to shard, loss_of(net, x, y))."""
    import torch
    import torch.nn.functional as F
    if name == "gpt":
        from nanogpt import GPT
        model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["vocab_size"], m["block_size"])
        return model, model.transformer.h, lambda net, x, y: net(x, y)[1]
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["n_embd"], intermediate_size=m["intermediate_size"],
                      num_hidden_layers=m["n_layer"], num_attention_heads=m["n_head"],
                      num_key_value_heads=m["n_kv_head"], max_position_embeddings=m["block_size"],
                      rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).float()

    def loss_of(net, x, y):
        logits = net(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    return model, model.model.layers, loss_of
LORA_TARGETS = {"gpt": ["c_attn", "c_proj", "c_fc"],
                "llama100m": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def with_lora(model, name, rank):
    """PEFT's rank-`rank` adapters (alpha 2 rank, no dropout) on every
    projection of `model` (torch_model's `name`), its base frozen: the peer of
    Shardline's [lora] with target_modules "all-linear"."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                            target_modules=LORA_TARGETS[name]))


PEER = {"no_shard": "DDP", "zero1": "DDP+ZeRO-1", "shard_grad_op": "FSDP2 no-reshard", "full_shard": "FSDP2",
        "hybrid_shard": "HSDP", "hybrid_shard_zero2": "HSDP no-reshard"}


def write_tokens(path, n, vocab, seed=1234):
    harness.write_llmc(path, np.random.default_rng(seed).integers(0, vocab, n))


def read_tokens(path):
    return np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64)


def batch(tokens, step, B, T, j0, count):
    """docs/design.md's order: sequence i = (step*B + j) mod n."""
    import torch
    n = (len(tokens) - 1) // T
    idx = [((step * B + j) % n) * T for j in range(j0, j0 + count)]
    x = np.stack([tokens[i:i + T] for i in idx])
    y = np.stack([tokens[i + 1:i + T + 1] for i in idx])
    return torch.from_numpy(x), torch.from_numpy(y)


# ---- one PyTorch rank (run as a subprocess of this script) --------------------

def torch_rank(a):
    import torch
    import torch.distributed as dist
    from nanogpt import lr_at
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)
    m = model_config(a.model, a.seq)
    model, blocks, loss_of = torch_model(a.model, m)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02) if p.dim() >= 2 else None
    if a.lora:
        model = with_lora(model, a.model, a.lora)
    opt_args = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)

    def groups(params):
        params = [p for p in params if p.requires_grad]
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    s = a.strategy
    if s in ("no_shard", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = DDP(model) if a.world > 1 else model
        if s == "zero1" and a.world > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(groups(net.parameters()), optimizer_class=torch.optim.AdamW, **opt_args)
        else:
            opt = torch.optim.AdamW(groups(net.parameters()), **opt_args)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if s.startswith("hybrid"):
            g = max(1, a.world // 2)
            mesh = init_device_mesh("cpu", (a.world // g, g), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (a.world,))
        reshard = s in ("full_shard", "hybrid_shard")
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        net = model
        opt = torch.optim.AdamW(groups(net.parameters()), **opt_args)
    tokens = read_tokens(a.data)
    B, T, per = a.batch, m["block_size"], a.batch // a.world
    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        for g_ in opt.param_groups:
            g_["lr"] = lr_at(step, a.steps, 6e-4, 6e-5, 2)
        opt.zero_grad(set_to_none=True)
        x, y = batch(tokens, step, B, T, a.rank * per, per)
        loss = loss_of(net, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        lv = loss.detach().clone()
        if a.world > 1:
            dist.all_reduce(lv)
            lv /= a.world
        losses.append(lv.item())
        times.append(time.perf_counter() - t0)
    rss = peak_rss()
    with open(os.path.join(a.out, f"torch-{a.rank}.json"), "w") as f:
        json.dump({"times": times, "losses": losses, "peak_rss": rss}, f)
    dist.destroy_process_group()


def run_torch(model, seq, strategy, world, threads, steps, batch_size, data, lora):
    out = tempfile.mkdtemp(prefix="torch-compare-")
    port = harness.free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--torch-rank", str(r), "--world", str(world),
                               "--port", str(port), "--threads", str(threads), "--strategy", strategy,
                               "--steps", str(steps), "--batch", str(batch_size), "--data", data, "--out", out,
                               "--model", model, "--seq", str(seq), "--lora", str(lora)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    # A rank that wrote its report and then aborted in Gloo's teardown
    # ("terminate called without an active exception") still counts.
    try:
        harness.wait_ranks(procs, 1800, done=lambda r: os.path.exists(os.path.join(out, f"torch-{r}.json")))
    except harness.RunError as e:
        return None, str(e).strip().splitlines()[-1]  # one line for the table
    ranks = [json.load(open(os.path.join(out, f"torch-{r}.json"))) for r in range(world)]
    return ranks, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--strategies", default="no_shard,zero1,shard_grad_op,full_shard,hybrid_shard,hybrid_shard_zero2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama100m"])
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: the model's block_size)")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on a frozen base (0: full fine-tuning)")
    # one PyTorch rank
    ap.add_argument("--torch-rank", type=int, default=-1)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's address (its TCP store)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--strategy", default="no_shard")
    ap.add_argument("--data", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.torch_rank >= 0:
        a.rank = a.torch_rank
        return torch_rank(a)

    import torch
    work = tempfile.mkdtemp(prefix="torch-compare-")
    data = os.path.join(work, "tokens.bin")
    m = model_config(a.model, a.seq)
    T = m["block_size"]
    write_tokens(data, a.steps * a.batch * T * 2 + 1, m["vocab_size"])
    cores = os.cpu_count()
    tokens = a.batch * T
    mib = 1 << 20
    lora = f", LoRA rank {a.lora} on every projection (PEFT on the PyTorch side)" if a.lora else ""
    print(f"# {a.model} {m}{lora}, global batch {a.batch} x {T} tokens, fp32, {a.steps - 1} timed steps after "
          f"1 warm-up, {cores} cores; torch {torch.__version__}; threads per rank = max(1, cores // N), both sides")
    print(f"{'strategy':<19} {'N':>2} {'thr':>3} {'shardline_tok/s':>15} {'pytorch':<17} {'pytorch_tok/s':>13} "
          f"{'ratio':>6} {'sl_rss_MiB':>10} {'pt_rss_MiB':>10} {'sl_loss':>8} {'pt_loss':>8}")
    for world in [int(w) for w in a.worlds.split(",")]:
        threads = max(1, cores // world)
        for strategy in a.strategies.split(","):
            if strategy.startswith("hybrid") and world < 2:
                continue  # a hybrid of one rank is no_shard
            cfg = harness.small_gpt_config(strategy, world, a.steps, a.batch)
            cfg["model"] = dict(m)
            cfg["data"] = {"format": "llmc", "path": data}
            cfg["optimizer"]["warmup_steps"] = 2
            if a.lora:
                cfg["lora"] = {"rank": a.lora, "alpha": 2 * a.lora, "target_modules": "all-linear", "base": "sharded"}
            _, ranks = harness.run(cfg, world, timeout=1800, threads=threads)
            sl_step = sum(s["seconds"] for s in ranks[0]["steps"][1:]) / (a.steps - 1)
            sl_rss = max(r["memory"]["peak_rss"] for r in ranks)
            sl_loss = ranks[0]["steps"][-1]["loss"]
            pt, err = run_torch(a.model, a.seq, strategy, world, threads, a.steps, a.batch, data, a.lora)
            if pt is None:
                print(f"{strategy:<19} {world:>2} {threads:>3} {tokens / sl_step:>15.0f} {PEER[strategy]:<17} "
                      f"{'failed':>13} {'-':>6} {sl_rss / mib:>10.0f} {'-':>10} {sl_loss:>8.4f} {'-':>8}  ({err})",
                      flush=True)
                continue
            pt_step = sum(pt[0]["times"][1:]) / (a.steps - 1)
            pt_rss = max(r["peak_rss"] for r in pt)
            print(f"{strategy:<19} {world:>2} {threads:>3} {tokens / sl_step:>15.0f} {PEER[strategy]:<17} "
                  f"{tokens / pt_step:>13.0f} {pt_step / sl_step:>6.2f} {sl_rss / mib:>10.0f} {pt_rss / mib:>10.0f} "
                  f"{sl_loss:>8.4f} {pt[0]['losses'][-1]:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
