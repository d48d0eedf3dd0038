"""Attention over packed documents on the CPU, in two tables.

1. The attention op alone (forward and backward, fp32, ATen's SDPA as
   shardline-train runs it): over a [T, T] mask of same-document keys (what
   the engine did before: every token pair scored), over each document alone
   (worker/model/document_attention.cc's algorithm: documents of one length
   batched into one causal SDPA), and plain causal attention over the whole
   sequence (the unpacked job's). Checked: the first two agree within 1e-5.
2. The engine: shardline-train steps of a small llama at T = 1024 on the
   same tokens, packed (documents of 64-256 tokens, [data] doc_path) and
   unpacked; tokens/s and the two runs' losses.

Sides alternate within each repeat; medians of --repeat runs with the spread
(min and max as % of the median).

    .venv/bin/python bench/packed_attention.py [--repeat 3] [--batch 4] [--steps 4]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402

T, H, D = 1024, 8, 64
DOCS_MAGIC = 20241126


def document_lengths(rng, n_tokens):
    """Lengths of 64 to 256 tokens, the last cut to fill n_tokens exactly."""
    out, left = [], n_tokens
    while left > 0:
        n = min(left, int(rng.integers(64, 257)))
        out.append(n)
        left -= n
    return out


def per_document(q, k, v, spans):
    """document_attention.cc's: documents of one length batched into one causal SDPA."""
    by_length = {}
    for b, seq in enumerate(spans):
        for start, n in seq:
            by_length.setdefault(n, []).append((b, start))
    out = [dict() for _ in spans]
    for n, where in by_length.items():
        y = F.scaled_dot_product_attention(torch.stack([q[b, :, s:s + n] for b, s in where]),
                                           torch.stack([k[b, :, s:s + n] for b, s in where]),
                                           torch.stack([v[b, :, s:s + n] for b, s in where]), is_causal=True)
        for i, (b, s) in enumerate(where):
            out[b][s] = y[i]
    return torch.stack([torch.cat([o[s] for s in sorted(o)], 1) for o in out])


def masked(q, k, v, spans):
    doc = torch.zeros(len(spans), T, dtype=torch.long)
    for b, seq in enumerate(spans):
        for i, (s, n) in enumerate(seq):
            doc[b, s:s + n] = i
    mask = (doc[:, :, None] == doc[:, None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])


def whole(q, k, v, spans):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def time_op(fn, q, k, v, spans, dy):
    for t in (q, k, v):
        t.grad = None
    t0 = time.perf_counter()
    fn(q, k, v, spans).backward(dy)
    return time.perf_counter() - t0


def time_forward(fn, q, k, v, spans):
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(q, k, v, spans)
        return time.perf_counter() - t0


def spread(xs):
    med = statistics.median(xs)
    return med, f"-{1 - min(xs) / med:.0%}/+{max(xs) / med - 1:.0%}"


def attention_table(a):
    spans = []
    for b in range(a.batch):
        lengths = document_lengths(np.random.default_rng(b), T)
        spans.append(list(zip(np.cumsum([0] + lengths)[:-1].tolist(), lengths)))
    torch.manual_seed(0)
    q, k, v = (torch.randn(a.batch, H, T, D, requires_grad=True) for _ in range(3))
    dy = torch.randn(a.batch, H, T, D)
    diff = (masked(q, k, v, spans) - per_document(q, k, v, spans)).abs().max().item()
    if diff > 1e-5:
        raise SystemExit(f"packed_attention.py: the per-document attention differs from the masked by {diff:.2e}")
    sides = {"dense mask [T, T]": masked, "per document": per_document, "causal, whole sequence": whole}
    times = {s: [] for s in sides}
    forward = {s: [] for s in sides}
    for _ in range(a.repeat):
        for name, fn in sides.items():  # alternating within each repeat
            times[name].append(time_op(fn, q, k, v, spans, dy))
            forward[name].append(time_forward(fn, q, k, v, spans))
    docs = sum(len(s) for s in spans)
    print(f"## attention alone: B={a.batch}, H={H}, T={T}, D={D}, {docs} documents of 64-256 tokens, fp32, "
          f"forward+backward, {torch.get_num_threads()} threads; agreement {diff:.1e}")
    print("| attention | forward+backward ms | spread | vs dense mask | forward ms | spread | vs dense mask |")
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(times["dense mask [T, T]"])
    fbase = statistics.median(forward["dense mask [T, T]"])
    for name, xs in times.items():
        med, sp = spread(xs)
        fmed, fsp = spread(forward[name])
        print(f"| {name} | {med * 1e3:.1f} | {sp} | {base / med:.2f}x | {fmed * 1e3:.1f} | {fsp} | {fbase / fmed:.2f}x |")


def engine_table(a):
    work = harness.scratch_dir("shardline-packed-")
    rng = np.random.default_rng(1)
    n = a.batch * a.steps * T + 1
    vocab = 512
    harness.write_llmc(os.path.join(work, "tokens.bin"), rng.integers(0, vocab, n))
    starts = np.zeros(n, dtype=np.uint8)
    at = 0
    for length in document_lengths(rng, n):
        starts[at] = 1
        at += length
    harness.write_llmc(os.path.join(work, "tokens.docs"), starts, magic=DOCS_MAGIC, dtype=np.uint8)
    model = {"family": "llama", "n_layer": 4, "n_head": H, "n_kv_head": 4, "n_embd": H * D, "intermediate_size": 1408,
             "vocab_size": vocab, "block_size": T, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": True}
    runs = {"packed (doc_path)": True, "unpacked": False}
    rates = {r: [] for r in runs}
    losses = {}
    for _ in range(a.repeat):
        for name, packed in runs.items():
            cfg = harness.config("no_shard", 1, micro_batches=1)
            cfg["model"] = dict(model)
            cfg["train"].update(steps=a.steps, batch_size=a.batch, micro_batch_size=a.batch)
            cfg["data"] = {"format": "llmc", "path": os.path.join(work, "tokens.bin")}
            if packed:
                cfg["data"]["doc_path"] = os.path.join(work, "tokens.docs")
            _, ranks = harness.run(cfg, 1, timeout=1800, threads=os.cpu_count() or 1)
            steps = ranks[0]["steps"][1:]  # after the first (allocations, warm caches)
            rates[name].append(statistics.median(a.batch * T / s["seconds"] for s in steps))
            losses[name] = ranks[0]["steps"][-1]["loss"]
    print(f"\n## the engine: a llama of 4 x {H * D} (GQA {H}:4, SwiGLU 1408), T={T}, batch {a.batch}, "
          f"no_shard at N=1, {a.steps} steps (the first left out), {os.cpu_count()} threads")
    print("| run | tokens/s | spread | last loss |")
    print("|---|---|---|---|")
    for name, xs in rates.items():
        med, sp = spread(xs)
        print(f"| {name} | {med:.0f} | {sp} | {losses[name]:.4f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    attention_table(a)
    engine_table(a)


if __name__ == "__main__":
    main()
