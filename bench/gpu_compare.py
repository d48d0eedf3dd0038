"""Shardline against PyTorch on one GPU, side by side, in one run and one table
(issue 22, item 3).

The same model, tokens (an llm.c .bin file of seeded random tokens both sides
read in DESIGN.md's order), global batch, steps, AdamW, schedule and clipping,
in bf16 compute with fp32 master weights and fp32 gradient reduction:

    shardline        shardline-train --device cuda:0, [precision] param_dtype = "bf16", reduce_dtype = "fp32"
    fsdp2            FSDP2 fully_shard per block and at the root, MixedPrecisionPolicy(bf16, fp32), NCCL
    fsdp2+compile    the same, each block torch.compile'd before fully_shard (as torchtitan does)

Models: GPT-2 124M and 350M (T = 1024, vocabulary padded to 50304 as llm.c
does), the ~100M Llama (bench/torch_compare.py's LLAMA_100M at T = 1024),
full fine-tuning and LoRA r = 16 on every projection (PEFT on the PyTorch
side). N = 1 (each eager row --repeat times, interleaved; the table gives the
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

    python3 bench/gpu_compare.py [--models gpt2-124m,gpt2-350m,llama100m,llama100m-lora16] [--repeat 3]
                                 [--steps 12] [--batch 8] [--budget 400] [--table FILE] [--device cuda:0]
                                 [--no-compile] [--shared-worlds 2,4] [--profile DIR]
    (--models gpt-small --device cpu: a dry run of the script where there is no GPU)
"""
import argparse
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


def model_of(name):
    """(torch_compare family, model dict, LoRA rank)."""
    if name in GPT2:
        return "gpt", dict(GPT2[name]), 0
    base, _, lora = name.partition("-lora")
    if base != "llama100m":
        raise SystemExit(f"gpu_compare.py: --models: unknown model {name!r}")
    m = dict(tc.LLAMA_100M)
    m["block_size"] = 1024
    return "llama100m", m, int(lora or 0)


def flops_per_token(family, m, lora):
    """llm.c's 6N + 12LHQT (LoRA: 4 N_base + 6 N_lora + 12LHQT); N from the PyTorch model."""
    import torch
    with torch.device("meta"):
        model, _, _ = tc.torch_model(family, m)
        n = sum(p.numel() for p in model.parameters())  # a tied weight is counted once
        n_lora = 0
        if lora:
            model = tc.with_lora(model, family, lora)
            n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attn = 12 * m["n_layer"] * m["n_embd"] * m["block_size"]
    return (4 * n + 6 * n_lora if lora else 6 * n) + attn, n, n_lora


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
    model, blocks, loss_of = tc.torch_model(family, m)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02) if p.dim() >= 2 else None
    if lora:
        model = tc.with_lora(model, family, lora)
    model.to(dev)
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
    tokens = tc.read_tokens(a.data)
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
        loss = loss_of(model, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        sync()
        times.append(time.perf_counter() - t0)
        if profiler and step + 1 in (PROFILE_STEPS[1], a.steps):  # the window's end, or the run's (as shardline-train)
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(a.profile_out)
            profiler = None
    with open(a.out, "w") as f:
        json.dump({"times": times, "losses": losses,
                   "alloc_peak": torch.cuda.max_memory_allocated(dev) if cuda else 0,
                   "reserved_peak": torch.cuda.max_memory_reserved(dev) if cuda else 0}, f)
    dist.destroy_process_group()


def run_torch(a, model, data, compile_, timeout, profile=""):
    out = os.path.join(tempfile.mkdtemp(prefix="gpu-compare-"), "torch.json")
    cmd = [sys.executable, __file__, "--torch-run", "--model", model, "--steps", str(a.steps), "--batch",
           str(a.batch), "--data", data, "--out", out, "--port", str(harness.free_port()), "--device", a.device]
    if compile_:
        cmd.append("--compile")
    if profile:
        cmd += ["--profile-out", profile]
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
            "loss": r["losses"][-1]}, ""


def run_shardline(a, model, data, strategy, world, timeout, profile="", recompute_cheap_ops=True):
    _, m, lora = model_of(model)
    cfg = harness.small_gpt_config(strategy, world, a.steps, a.batch)
    cfg.setdefault("memory", {})["recompute_cheap_ops"] = recompute_cheap_ops
    cfg["model"] = m
    cfg["data"] = {"format": "llmc", "path": data}
    cfg["optimizer"]["warmup_steps"] = WARMUP
    cfg["precision"] = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    if lora:
        cfg["lora"] = {"rank": lora, "alpha": 2 * lora, "target_modules": "all-linear", "base": "sharded"}
    try:
        _, ranks = harness.run(cfg, world, timeout=timeout, threads=max(1, (os.cpu_count() or 2) // world),
                               extra_args=("--device", a.device) + (("--backend", "gloo") if world > 1 else ())
                               + (("--profile", profile, "--profile-steps", "%d:%d" % PROFILE_STEPS) if profile else ()))
    except harness.RunError as e:
        return None, str(e).splitlines()[-1][-200:]
    return {"step": statistics.median(s["seconds"] for s in ranks[0]["steps"][WARMUP:]),
            "alloc": max(r["memory"]["tensor_peak"] for r in ranks),
            "reserved": max(r["memory"]["reserved_peak"] for r in ranks),
            "loss": ranks[0]["steps"][-1]["loss"]}, ""


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
            ("spread", 11, ">"), ("MFU", 6, ">"), ("vs fsdp2", 8, ">"), ("alloc GiB", 9, ">"),
            ("reserved GiB", 12, ">"), ("loss", 7, ">")]

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
            self.line([model, run, world, 0, "failed"] + [""] * 6, err)
            return
        steps = sorted(r["step"] for r in samples)
        med = statistics.median(steps)
        tps = tokens / med
        spread = f"-{1 - med / steps[-1]:.0%}/+{med / steps[0] - 1:.0%}" if len(steps) > 1 else "-"
        ratio = f"{statistics.median(r['step'] for r in peer) / med:.2f}x" if peer else "-"
        gib = 1 << 30
        self.line([model, run, world, len(steps), f"{tps:.0f}", spread, f"{tps * fpt / PEAK_FLOPS:.1%}", ratio,
                   f"{max(r['alloc'] for r in samples) / gib:.2f}", f"{max(r['reserved'] for r in samples) / gib:.2f}",
                   f"{samples[-1]['loss']:.4f}"], err)


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
               f"after {WARMUP} warm-ups; MFU against {PEAK_FLOPS / 1e12:.0f} TFLOP/s")
    table.header()
    models = a.models.split(",")
    # The eager N = 1 pairs first, interleaved over the repeats (so that every
    # row has runs when the budget ends early), then N > 1, then compile.
    rounds = [[(mdl, run, 1) for mdl in models for run in ("fsdp2", "shardline")] for _ in range(a.repeat)]
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        rounds.insert(1, [(mdl, run + " profile", 1) for mdl in models for run in ("fsdp2", "shardline")])
    plan = [key for r in rounds for key in r]
    plan += [(models[0], "shardline full_shard" + (" gloo" if int(w) > 1 else ""), int(w))
             for w in a.shared_worlds.split(",") if w]
    if a.keep_cheap_ops:
        plan.append((models[0], "shardline keep-cheap-ops", 1))
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
            tc.write_tokens(data[family], a.steps * a.batch * m["block_size"] + 1, m["vocab_size"])
        timeout = max(10, a.budget - (time.time() - start))
        if profiling:
            profile(a, mdl, run.split()[0], data[family], timeout)
            continue
        if run.startswith("shardline"):
            strategy = "full_shard" if world > 1 or "full_shard" in run else "no_shard"
            r, err = run_shardline(a, mdl, data[family], strategy, world, timeout,
                                   recompute_cheap_ops=not run.endswith("keep-cheap-ops"))
        else:
            r, err = run_torch(a, mdl, data[family], run.endswith("compile"), timeout)
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
        peer = samples.get((key[0], "fsdp2", 1)) if key[1] != "fsdp2" else None
        table.row(key, samples.get(key, []), fpt, a.batch * m["block_size"], peer, errors.get(key, ""))


if __name__ == "__main__":
    main()
