"""Shardline against PyTorch on one GPU, side by side, in one run and one table
(issue 22, item 3).

The same model, tokens (an llm.c .bin file of seeded random tokens both sides
read in docs/design.md's order), global batch, steps, AdamW, schedule and clipping,
in bf16 compute with fp32 master weights and fp32 gradient reduction:

    shardline        shardline-train --device cuda:0, [precision] param_dtype = "bf16", reduce_dtype = "fp32"
    fsdp2            FSDP2 fully_shard per block and at the root, MixedPrecisionPolicy(bf16, fp32), NCCL
    fsdp2+compile    the same, each block torch.compile'd before fully_shard (as torchtitan does)

Models: GPT-2 124M and 350M (T = 1024, vocabulary padded to 50304 as llm.c
does), the ~100M Llama (bench/torch_compare.py's LLAMA_100M at T = 1024),
full fine-tuning and LoRA r = 16 on every projection (PEFT on the PyTorch
side).

The seeds' workload, qwen3-4b-lora16: Qwen3-4B's shape (36 x 2560, GQA 32:8,
head_dim 128, SwiGLU 9728, vocabulary 151,936, tied, q/k norm) at T = 1024,
LoRA r = 16 (alpha 32) on every projection, activation checkpointing on both
sides, random weights (the speed and memory of a step do not depend on them).
Its peers are what a user runs: "peft", transformers' Qwen3ForCausalLM with
PEFT in one process (a bf16 base, PEFT's fp32 adapters, bf16 autocast, as
HF's Trainer with bf16=True; non-reentrant gradient checkpointing), and
"peft+fsdp2", the same under FSDP2 at one rank (fully_shard per layer,
MixedPrecisionPolicy(bf16, fp32)); Shardline runs full_shard at N = 1. Its
rows also give the seconds from launch to the end of the first step and,
for Shardline, `shardctl plan`'s predicted peak for the job (checkpointed)
beside the allocator's. qwen3-tiny-lora16 is the same at the tiny Qwen3's
size: a dry run of that path on a CPU. N = 1 (each eager row --repeat times, interleaved; the table gives the
median and the spread), and Shardline's full_shard at --shared-worlds: at 1, one rank
(FSDP2's fully_shard semantics at world 1: each unit's bf16 parameters and
gradients freed after use, where no_shard keeps them), at 2 and 4, ranks sharing the GPU
through Gloo staging (PyTorch has no peer for that: NCCL 2.28 refuses two
ranks on one GPU, and Gloo cannot reduce-scatter CUDA tensors). With
--keep-cheap-ops, also Shardline at N = 1 with [memory] recompute_cheap_ops =
false (the GELU, SwiGLU and norm outputs kept, not computed again in
backward): what that setting's memory costs and its speed buys.

Figures: tokens/s (median step over the steps after 2 warm-ups), MFU against
989 TFLOP/s (the H100 SXM's dense bf16 peak), and the CUDA caching
allocator's peak allocated and reserved bytes. FLOPs per token follow llm.c and
PaLM (appendix B): 6 N + 12 L H Q T for full fine-tuning, where N counts every
parameter once (the tied embedding is the head's matmul); LoRA has no weight
gradients for the frozen base, so 4 N_base + 6 N_lora + 12 L H Q T.
Each row is printed and appended to --table as soon as it is measured, and
runs stop being started once --budget seconds have passed, so a device call
that ends early still leaves every row it measured.

With --profile DIR, after the first round each model runs once more on each
side (Shardline, eager FSDP2) under LibTorch's Kineto profiler over steps
PROFILE_STEPS (shardline-train --profile; torch.profiler in the PyTorch
process), the traces go to DIR, and bench/profile_summary.py prints where each
side's step goes: the device's busy and idle time, kernels by kind, the
largest kernels.

    python3 bench/gpu_compare.py [--models gpt2-124m,gpt2-350m,llama100m,llama100m-lora16,qwen3-4b-lora16] [--repeat 3]
                                 [--steps 12] [--batch 8] [--budget 400] [--table FILE] [--device cuda:0]
                                 [--no-compile] [--shared-worlds 2,4] [--profile DIR]
    (--models gpt-small or qwen3-tiny-lora16 --device cpu: a dry run of the script where there is no GPU)
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))

import harness  # noqa: E402
import profile_summary  # noqa: E402
import torch_compare as tc  # noqa: E402

PEAK_FLOPS = 989e12  # H100 SXM dense bf16
GPT2 = {"gpt2-124m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "block_size": 1024},
        "gpt2-350m": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "vocab_size": 50304, "block_size": 1024},
        "gpt-small": harness.SMALL_GPT}  # a dry run of this script on a CPU
WARMUP = 2
PROFILE_STEPS = (2, 5)  # steps 2, 3 and 4: after the warm-ups


# Qwen3-4B's config.json as the engine's [model] table (the seeds' model).
QWEN3 = {"qwen3-4b": {"family": "llama", "n_layer": 36, "n_head": 32, "n_kv_head": 8, "n_embd": 2560, "head_dim": 128,
                      "intermediate_size": 9728, "vocab_size": 151936, "block_size": 1024, "rope_theta": 1000000.0,
                      "rms_norm_eps": 1e-6, "qk_norm": True, "tie_word_embeddings": True},
         "qwen3-tiny": dict(harness.llama_model("qwen3"), vocab_size=512, block_size=128)}  # a dry run on a CPU
# The runs each family is measured against, the first the ratio's peer.
PEERS = {"gpt": ("fsdp2",), "llama100m": ("fsdp2",), "qwen3": ("peft", "peft+fsdp2")}


def model_of(name):
    """(family, model dict, LoRA rank): family is torch_compare's, or qwen3."""
    if name in GPT2:
        return "gpt", dict(GPT2[name]), 0
    base, _, lora = name.partition("-lora")
    if base in QWEN3:
        return "qwen3", dict(QWEN3[base]), int(lora or 0)
    if base != "llama100m":
        raise SystemExit(f"gpu_compare.py: --models: unknown model {name!r}")
    m = dict(tc.LLAMA_100M)
    m["block_size"] = 1024
    return "llama100m", m, int(lora or 0)


def qwen3_model(m, dtype):
    """transformers' Qwen3ForCausalLM of the [model] table m, in dtype, on the current device."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=m["vocab_size"], hidden_size=m["n_embd"], intermediate_size=m["intermediate_size"],
                      num_hidden_layers=m["n_layer"], num_attention_heads=m["n_head"],
                      num_key_value_heads=m["n_kv_head"], head_dim=m["head_dim"], rope_theta=m["rope_theta"],
                      max_position_embeddings=m["block_size"], rms_norm_eps=m["rms_norm_eps"],
                      tie_word_embeddings=True, attn_implementation="sdpa")
    torch.set_default_dtype(dtype)
    try:
        return Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)


def peer_model(family, m, lora):
    """(model, blocks to shard, loss_of) of the PyTorch side, LoRA applied."""
    import torch
    import torch.nn.functional as F
    if family != "qwen3":
        model, blocks, loss_of = tc.torch_model(family, m)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02) if p.dim() >= 2 else None
        return (tc.with_lora(model, family, lora) if lora else model), blocks, loss_of
    from peft import LoraConfig, get_peft_model
    model = qwen3_model(m, torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as the seeds run it
    blocks = model.model.layers
    model = get_peft_model(model, LoraConfig(r=lora, lora_alpha=2 * lora, lora_dropout=0.0,
                                             target_modules=tc.LORA_TARGETS["llama100m"]))

    def loss_of(net, x, y):  # HF's causal LM loss: the logits in fp32
        logits = net(input_ids=x).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
    return model, blocks, loss_of


def flops_per_token(family, m, lora):
    """llm.c's 6N + 12LHQT (LoRA: 4 N_base + 6 N_lora + 12LHQT, the frozen base
    has no weight gradients); N from the PyTorch model, HQ the attention's
    width (n_head * head_dim: Qwen3-4B's 4096, not its 2560)."""
    import torch
    with torch.device("meta"):
        model, _, _ = peer_model(family, m, lora)
        n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad) if lora else 0
        n = sum(p.numel() for p in model.parameters()) - n_lora  # a tied weight is counted once
    width = m["n_head"] * m.get("head_dim", m["n_embd"] // m["n_head"])
    attn = 12 * m["n_layer"] * width * m["block_size"]
    return (4 * n + 6 * n_lora if lora else 6 * n) + attn, n, n_lora


def write_tokens(path, n, vocab, seed=1234):
    """Seeded random tokens as an llm.c file: uint16 (GPT-2's header), or
    uint32 (Llama 3's, magic 20240801 version 7) past 65,536 tokens."""
    import numpy as np
    values = np.random.default_rng(seed).integers(0, vocab, n)
    if vocab <= 1 << 16:
        harness.write_llmc(path, values)
    else:
        harness.write_llmc(path, values, magic=20240801, version=7)


def read_tokens(path):
    import numpy as np
    magic = int(np.fromfile(path, dtype=np.int32, count=1)[0])
    return np.fromfile(path, dtype=np.uint32 if magic == 20240801 else np.uint16, offset=1024).astype(np.int64)


# ---- one PyTorch process on the GPU (a subprocess of this script) --------------

def torch_run(a):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from nanogpt import lr_at
    torch.manual_seed(1337)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"  # cpu: a dry run of this script where there is no GPU
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=0,
                            world_size=1, device_id=dev if cuda else None)
    family, m, lora = model_of(a.model)
    with dev:
        model, blocks, loss_of = peer_model(family, m, lora)
    model.to(dev)
    autocast = contextlib.nullcontext()
    if a.eager:  # one process, no FSDP: bf16 compute by autocast, as HF's Trainer with bf16=True
        autocast = torch.autocast(dev.type, dtype=torch.bfloat16)
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in blocks:
            if a.compile:
                block.compile()
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    tokens = read_tokens(a.data)
    B, T = a.batch, m["block_size"]
    times, losses = [], []
    profiler = None
    for step in range(a.steps):
        sync()
        if a.profile_out and step == PROFILE_STEPS[0]:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            profiler = torch.profiler.profile(activities=acts, record_shapes=True)
            profiler.__enter__()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, 6e-4, 6e-5, WARMUP)
        opt.zero_grad(set_to_none=True)
        x, y = tc.batch(tokens, step, B, T, 0, B)
        with autocast:
            loss = loss_of(model, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        sync()
        times.append(time.perf_counter() - t0)
        if step == 0:
            first_step_end = time.time()
        if profiler and step + 1 in (PROFILE_STEPS[1], a.steps):  # the window's end, or the run's (as shardline-train)
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(a.profile_out)
            profiler = None
    with open(a.out, "w") as f:
        json.dump({"times": times, "losses": losses, "first_step_end_unix": first_step_end,
                   "alloc_peak": torch.cuda.max_memory_allocated(dev) if cuda else 0,
                   "reserved_peak": torch.cuda.max_memory_reserved(dev) if cuda else 0}, f)
    dist.destroy_process_group()


def run_torch(a, model, data, compile_, timeout, profile="", eager=False):
    out = os.path.join(tempfile.mkdtemp(prefix="gpu-compare-"), "torch.json")
    cmd = [sys.executable, __file__, "--torch-run", "--model", model, "--steps", str(a.steps), "--batch",
           str(a.batch), "--data", data, "--out", out, "--port", str(harness.free_port()), "--device", a.device]
    if compile_:
        cmd.append("--compile")
    if eager:
        cmd.append("--eager")
    if profile:
        cmd += ["--profile-out", profile]
    launched = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout:.0f} s"
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()
        return None, tail[-1] if tail else f"exit {p.returncode}"
    with open(out) as f:
        r = json.load(f)
    return {"step": statistics.median(r["times"][WARMUP:]), "alloc": r["alloc_peak"], "reserved": r["reserved_peak"],
            "loss": r["losses"][-1], "start": r["first_step_end_unix"] - launched}, ""


def shardline_config(a, model, data, strategy, world, recompute_cheap_ops=True):
    family, m, lora = model_of(model)
    cfg = harness.small_gpt_config(strategy, world, a.steps, a.batch)
    cfg.setdefault("memory", {})["recompute_cheap_ops"] = recompute_cheap_ops
    cfg["model"] = m
    cfg["data"] = {"format": "llmc", "path": data}
    cfg["optimizer"]["warmup_steps"] = WARMUP
    cfg["precision"] = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    if lora:
        cfg["lora"] = {"rank": lora, "alpha": 2 * lora, "target_modules": "all-linear", "base": "sharded"}
    if family == "qwen3":
        cfg["memory"]["activation_checkpointing"] = True  # as the seeds run it, and as the peers do here
    return cfg


def planned_peak(cfg, world):
    """`shardctl plan`'s peak bytes a rank for the job's strategy (checkpointed where the job checkpoints)."""
    job = os.path.join(tempfile.mkdtemp(prefix="gpu-compare-plan-"), "job.toml")
    harness.write_toml(cfg, job)
    p = subprocess.run([os.path.join(harness.BUILD, "client", "shardctl"), "--json", "plan", job, "--workers",
                        str(world)], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return 0
    plan = json.loads(p.stdout)
    row = next((r for r in plan["strategies"] if r["strategy"] == cfg["parallelism"]["strategy"]), None)
    if not row:
        return 0
    return row["peak_bytes_checkpointed" if cfg["memory"].get("activation_checkpointing") else "peak_bytes"]


def run_shardline(a, model, data, strategy, world, timeout, profile="", recompute_cheap_ops=True):
    cfg = shardline_config(a, model, data, strategy, world, recompute_cheap_ops)
    launched = time.time()
    try:
        _, ranks = harness.run(cfg, world, timeout=timeout, threads=max(1, (os.cpu_count() or 2) // world),
                               extra_args=("--device", a.device) + (("--backend", "gloo") if world > 1 else ())
                               + (("--profile", profile, "--profile-steps", "%d:%d" % PROFILE_STEPS) if profile else ()))
    except harness.RunError as e:
        return None, str(e).splitlines()[-1][-200:]
    return {"step": statistics.median(s["seconds"] for s in ranks[0]["steps"][WARMUP:]),
            "alloc": max(r["memory"]["tensor_peak"] for r in ranks),
            "reserved": max(r["memory"]["reserved_peak"] for r in ranks),
            "loss": ranks[0]["steps"][-1]["loss"], "start": ranks[0]["steps"][0]["ended_unix"] - launched,
            "plan": planned_peak(cfg, world)}, ""


def profile(a, model, side, data, timeout):
    """One run of `side` under the profiler; prints where its step goes."""
    trace = os.path.join(a.profile, f"{side}-{model}.json")
    if side == "shardline":
        r, err = run_shardline(a, model, data, "no_shard", 1, timeout, profile=trace)
    else:
        r, err = run_torch(a, model, data, False, timeout, profile=trace)
    if not r or not os.path.exists(trace):
        print(f"  {model} {side} profile: failed: {err or 'no trace written'}", flush=True)
        return
    lines, _ = profile_summary.summarize(profile_summary.load(trace), PROFILE_STEPS[1] - PROFILE_STEPS[0])
    print(f"== profile: {model}, {side}, steps {PROFILE_STEPS[0]}..{PROFILE_STEPS[1] - 1} (trace {trace})")
    print("\n".join(lines), flush=True)


class Table:
    """Rows as they are measured (one per run), then the summary: per row the
    median over its runs, the spread (min and max as % of the median) and the
    ratio of medians to eager FSDP2's."""
    COLS = [("model", 17, "<"), ("run", 25, "<"), ("N", 1, ">"), ("runs", 4, ">"), ("tok/s", 8, ">"),
            ("spread", 11, ">"), ("MFU", 6, ">"), ("vs peer", 8, ">"), ("alloc GiB", 9, ">"),
            ("reserved GiB", 12, ">"), ("plan GiB", 8, ">"), ("start s", 7, ">"), ("loss", 7, ">")]

    def __init__(self, path):
        self.path = path

    def emit(self, line):
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")

    def line(self, cells, note=""):
        body = " | ".join(f"{str(c):{al}{w}}" for c, (_, w, al) in zip(cells, self.COLS))
        self.emit(f"| {body} |{' ' + note if note else ''}")

    def header(self):
        self.line([name for name, _, _ in self.COLS])
        self.emit("|" + "|".join("-" * (w + 2) for _, w, _ in self.COLS) + "|")

    def row(self, key, samples, fpt, tokens, peer, err=""):
        model, run, world = key
        if not samples:
            self.line([model, run, world, 0, "failed"] + [""] * (len(self.COLS) - 5), err)
            return
        steps = sorted(r["step"] for r in samples)
        med = statistics.median(steps)
        tps = tokens / med
        spread = f"-{1 - med / steps[-1]:.0%}/+{med / steps[0] - 1:.0%}" if len(steps) > 1 else "-"
        ratio = f"{statistics.median(r['step'] for r in peer) / med:.2f}x" if peer else "-"
        gib = 1 << 30
        alloc = max(r["alloc"] for r in samples)
        plan = samples[-1].get("plan", 0)
        plan_cell = f"{plan / gib:.2f}" if plan else "-"
        if plan and alloc:  # the plan's error: the target is within 10%
            err = (err + " " if err else "") + f"(alloc {alloc / plan - 1:+.0%} of the plan)"
        start = statistics.median(r["start"] for r in samples)
        self.line([model, run, world, len(steps), f"{tps:.0f}", spread, f"{tps * fpt / PEAK_FLOPS:.1%}", ratio,
                   f"{alloc / gib:.2f}", f"{max(r['reserved'] for r in samples) / gib:.2f}", plan_cell,
                   f"{start:.1f}", f"{samples[-1]['loss']:.4f}"], err)


def shardline_run(model):
    """Shardline's row name at N = 1: no_shard, or full_shard for the seeds' workload (as they run it)."""
    return "shardline full_shard" if model_of(model)[0] == "qwen3" else "shardline"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-124m,gpt2-350m,llama100m,llama100m-lora16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each eager N = 1 row (compile and N > 1: one)")
    ap.add_argument("--budget", type=float, default=400, help="seconds after which no run is started")
    ap.add_argument("--table", default="", help="also append the table's lines to this file")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--shared-worlds", default="2,4",
                    help="Shardline full_shard at these N sharing the GPU over Gloo (first model only); "
                         "1: full_shard on one rank, FSDP2's fully_shard at world 1 (units freed after use)")
    ap.add_argument("--keep-cheap-ops", action="store_true",
                    help="also Shardline at N=1 with [memory] recompute_cheap_ops = false (first model only)")
    ap.add_argument("--profile", default="", help="profile each model once per side after the first round; traces here")
    # one PyTorch process
    ap.add_argument("--torch-run", action="store_true")
    ap.add_argument("--model", default="")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--eager", action="store_true", help="no FSDP: autocast to bf16 (the peft row)")
    ap.add_argument("--data", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--profile-out", default="")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    if a.torch_run:
        return torch_run(a)

    import torch
    start = time.time()
    table = Table(a.table)
    name = torch.cuda.get_device_name(a.device) if torch.cuda.is_available() else "no CUDA device"
    table.emit(f"# {name}; torch {torch.__version__}; bf16 compute, fp32 master and reduction; global batch "
               f"{a.batch} sequences of the model's block size; each run's median step of {a.steps - WARMUP} "
               f"after {WARMUP} warm-ups; MFU against {PEAK_FLOPS / 1e12:.0f} TFLOP/s; vs peer: tokens/s over eager "
               f"FSDP2's (PEFT's in one process for qwen3); plan: shardctl plan's peak; start: launch to the first "
               f"step's end")
    table.header()
    models = a.models.split(",")
    # The eager N = 1 pairs first, interleaved over the repeats (so that every
    # row has runs when the budget ends early), then N > 1, then compile.
    rounds = [[(mdl, run, 1) for mdl in models for run in PEERS[model_of(mdl)[0]][:1] + (shardline_run(mdl),)]
              for _ in range(a.repeat)]
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        rounds.insert(1, [(mdl, run + " profile", 1) for mdl in models for run in ("fsdp2", "shardline")
                          if model_of(mdl)[0] != "qwen3"])
    plan = [key for r in rounds for key in r]
    plan += [(models[0], "shardline full_shard" + (" gloo" if int(w) > 1 else ""), int(w))
             for w in a.shared_worlds.split(",") if w]
    if a.keep_cheap_ops:
        plan.append((models[0], "shardline keep-cheap-ops", 1))
    plan += [(mdl, run, 1) for mdl in models for run in PEERS[model_of(mdl)[0]][1:]]  # (one run each)
    if not a.no_compile:
        plan += [(mdl, "fsdp2+compile", 1) for mdl in models if model_of(mdl)[2] == 0]  # (full fine-tuning)
    work = tempfile.mkdtemp(prefix="gpu-compare-")
    data, samples, errors, order = {}, {}, {}, []
    for key in plan:
        mdl, run, world = key
        profiling = run.endswith(" profile")  # printed, not a row of the table
        if key not in order and not profiling:
            order.append(key)
        if a.budget - (time.time() - start) < 20:
            if not profiling:
                errors.setdefault(key, f"not run: the budget of {a.budget:.0f} s was spent")
            continue
        family, m, _ = model_of(mdl)
        if family not in data:
            data[family] = os.path.join(work, f"{family}.bin")
            write_tokens(data[family], a.steps * a.batch * m["block_size"] + 1, m["vocab_size"])
        timeout = max(10, a.budget - (time.time() - start))
        if profiling:
            profile(a, mdl, run.split()[0], data[family], timeout)
            continue
        if run.startswith("shardline"):
            strategy = "full_shard" if world > 1 or "full_shard" in run else "no_shard"
            r, err = run_shardline(a, mdl, data[family], strategy, world, timeout,
                                   recompute_cheap_ops=not run.endswith("keep-cheap-ops"))
        else:
            r, err = run_torch(a, mdl, data[family], run.endswith("compile"), timeout, eager=run == "peft")
        if r:
            samples.setdefault(key, []).append(r)
            print(f"  {mdl} {run} N={world}: {a.batch * m['block_size'] / r['step']:.0f} tok/s", flush=True)
        else:
            errors[key] = err
            print(f"  {mdl} {run} N={world}: failed: {err}", flush=True)
    table.emit("")
    table.header()
    for key in order:
        family, m, lora = model_of(key[0])
        fpt, _, _ = flops_per_token(family, m, lora)
        peer_run = PEERS[family][0]
        peer = samples.get((key[0], peer_run, 1)) if key[1] != peer_run else None
        table.row(key, samples.get(key, []), fpt, a.batch * m["block_size"], peer, errors.get(key, ""))


if __name__ == "__main__":
    main()
