"""Data for fine-tuning: token shards as one stream, loss masks, validation.

The training data is three llm.c shards, named once as a list and once
through a glob, with a loss mask per shard (prompt tokens masked out,
completion tokens in):

1. Step 0 in one process: the batch is the stream order of docs/design.md over the
   concatenated shards, computed here; the masked-out targets are -100; the
   engine's loss and every gradient equal PyTorch's cross_entropy with
   ignore_index (the mean over the counted targets) in fp32.
2. Ten steps against torch.optim.AdamW on those batches; full_shard at N=3 and
   hybrid_shard at N=4 equal one process (the loss divisor is the global
   count of counted targets, whatever the split over ranks).
3. Validation: eval_interval = 4, eval_batches = 3 over a val shard: the
   engine reports val_loss after steps 4, 8 and the last (10), none
   elsewhere, and the last equals PyTorch's loss of the final parameters over
   the same three batches; N=3 reports what N=1 does.
4. Refused, naming the key: eval_interval without val_path, a mask with
   text data, a glob that matches nothing.
5. [train] epochs: 1.5 passes over the three shards' 60 sequences are
   ceil(1.5 * 60 / B) steps; each step reports its epoch, step x B / 60;
   epochs beside steps, and epochs of synthetic data, are refused.
"""
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import harness

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from nanogpt import GPT, model_from, train_reference  # noqa: E402
from step0 import check_step0  # noqa: E402

torch.set_num_threads(1)
VOCAB, T = 64, 16


def make_data(d):
    """Three shards of prompt/completion pairs (completion tokens count), and a val shard."""
    rng = np.random.default_rng(0)
    streams = []
    for i, n in enumerate((300, 411, 257)):
        tokens = rng.integers(0, VOCAB, n)
        mask = np.zeros(n, dtype=np.uint8)
        pos = 0
        while pos < n:  # prompt of 3..9 tokens, then a completion of 2..12
            prompt, completion = rng.integers(3, 10), rng.integers(2, 13)
            mask[pos + prompt:pos + prompt + completion] = 1
            pos += prompt + completion
        harness.write_llmc(os.path.join(d, f"train_{i:02d}.bin"), tokens)
        harness.write_llmc(os.path.join(d, f"train_{i:02d}.mask"), mask, magic=20240905)
        streams.append((tokens, mask))
    harness.write_llmc(os.path.join(d, "val.bin"), rng.integers(0, VOCAB, 700))
    tokens = np.concatenate([s[0] for s in streams])
    mask = np.concatenate([s[1] for s in streams])
    return tokens, mask


def batch(tokens, mask, step, B):
    """docs/design.md's order over the stream: sequence (step*B + j) mod n; masked targets -100."""
    n = (len(tokens) - 1) // T
    xs, ys = [], []
    for j in range(B):
        i = (step * B + j) % n
        xs.append(tokens[i * T:i * T + T])
        y = tokens[i * T + 1:i * T + T + 1].astype(np.int64)
        if mask is not None:
            y = np.where(mask[i * T + 1:i * T + T + 1] == 1, y, -100)
        ys.append(y)
    return torch.tensor(np.array(xs), dtype=torch.long), torch.tensor(np.array(ys), dtype=torch.long)


def config(d, strategy, world, globbed=False, **overrides):
    cfg = harness.config(strategy, world, micro_batches=2, data__format="llmc", **overrides)
    if globbed:
        cfg["data"]["path"] = os.path.join(d, "train_*.bin")
        cfg["data"]["mask_path"] = os.path.join(d, "train_*.mask")
    else:
        cfg["data"]["path"] = [os.path.join(d, f"train_{i:02d}.bin") for i in range(3)]
        cfg["data"]["mask_path"] = [os.path.join(d, f"train_{i:02d}.mask") for i in range(3)]
    return cfg


def refused(checks, label, d, cfg, expected):
    path = os.path.join(d, f"bad-{label.replace(' ', '_')}.toml")
    harness.write_toml(cfg, path)
    harness.refused_at_submit(checks, label, path, expected)


def main():
    checks = harness.Checks()
    d = harness.scratch_dir("shardline-data-")
    tokens, mask = make_data(d)

    # 1. Step 0 against cross_entropy(ignore_index=-100).
    cfg = config(d, "no_shard", 1)
    job = os.path.join(d, "job.toml")
    harness.write_toml(cfg, job)
    out = os.path.join(d, "dump.safetensors")
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", out], check=True, timeout=120)
    dump = load_file(out)
    x, y = batch(tokens, mask, 0, cfg["train"]["batch_size"])
    checks.check(torch.equal(dump["batch.inputs"], x) and torch.equal(dump["batch.targets"], y),
                 "step 0's batch is the stream order over three shards, masked targets -100",
                 f"{int((y != -100).sum())} of {y.numel()} targets count")
    model = model_from(dump, cfg["model"])
    logits, _ = model(x)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), ignore_index=-100)
    check_step0(checks, dump, model, logits, loss, "masked step 0: ")

    # 2. Ten steps against AdamW; other world sizes and strategies.
    ref, ref_losses = train_reference(dump, cfg)
    runs = {}
    for strategy, world, globbed in (("no_shard", 1, False), ("full_shard", 3, True), ("hybrid_shard", 4, True)):
        c = config(d, strategy, world, globbed, train__eval_interval=4, train__eval_batches=3,
                   data__val_path=os.path.join(d, "val.bin"))
        run_out, ranks = harness.run(c, world)
        runs[(strategy, world)] = (load_file(os.path.join(run_out, "params.safetensors")), ranks[0]["steps"])
    params, steps = runs[("no_shard", 1)]
    diff = max(float((params[k] - ref[k]).abs().max()) for k in params)
    checks.check(diff < 2e-5, "masked: 10 steps vs torch AdamW", f"max abs diff {diff:.2e}")
    lrel = max(abs(s["loss"] - r) / r for s, r in zip(steps, ref_losses))
    checks.check(lrel < 1e-5, "masked: losses vs torch", f"max rel diff {lrel:.2e}")
    for key in (("full_shard", 3), ("hybrid_shard", 4)):
        p, s = runs[key]
        # The key third of c_attn.bias apart (harness.param_diffs: its true
        # gradient is zero, and Adam turns rounding noise there into steps of
        # up to ~lr): held to 2 * lr * steps. The rest differs by the order of
        # the gradient sums only (harness.reorder_param_tol).
        diff, key_diff = harness.param_diffs(p, params)
        lr, n = cfg["optimizer"]["lr"], cfg["train"]["steps"]
        tol = harness.reorder_param_tol(lr, n)
        checks.check(diff < tol, f"masked: {key[0]} N={key[1]} (globbed paths) equals one process",
                     f"max abs diff {diff:.2e} (key bias apart; tol {tol:.1e})")
        checks.check(key_diff <= 2 * lr * n, f"masked: {key[0]} N={key[1]} key bias (zero true gradient)",
                     f"max abs diff {key_diff:.2e} (tol {2 * lr * n:.1e})")

    # 3. Validation losses.
    evaluated = [s["step"] + 1 for s in steps if s["val_loss"] is not None]
    checks.check(evaluated == [4, 8, 10], "val_loss after steps 4, 8 and the last", str(evaluated))
    model = GPT(**{k: cfg["model"][k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")})
    state = {k: v for k, v in params.items() if k.startswith("transformer.")}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state)
    val = np.fromfile(os.path.join(d, "val.bin"), dtype=np.uint16, offset=1024)
    with torch.no_grad():
        total = 0.0
        for b in range(3):
            vx, vy = batch(val, None, b, cfg["train"]["batch_size"])
            total += F.cross_entropy(model(vx)[0].view(-1, VOCAB), vy.view(-1), reduction="sum").item()
        expected = total / (3 * cfg["train"]["batch_size"] * T)
    got = steps[-1]["val_loss"]
    checks.check(abs(got - expected) / expected < 1e-6, "final val_loss equals PyTorch's over the same batches",
                 f"{got:.6f} vs {expected:.6f}")
    for key in (("full_shard", 3), ("hybrid_shard", 4)):
        v = [s["val_loss"] for s in runs[key][1] if s["val_loss"] is not None]
        ref_v = [s["val_loss"] for s in steps if s["val_loss"] is not None]
        worst = max(abs(a - b) / b for a, b in zip(v, ref_v))
        checks.check(len(v) == 3 and worst < 1e-6, f"val_loss at {key[0]} N={key[1]} equals one process",
                     f"max rel diff {worst:.2e}")

    # 4. Refusals.
    bad = config(d, "no_shard", 1, train__eval_interval=5)
    refused(checks, "eval_interval without val_path", d, bad, "[train] eval_interval = 5 needs [data] val_path")
    bad = config(d, "no_shard", 1)
    bad["data"]["format"] = "text"
    refused(checks, "mask with text", d, bad, 'loss masks (mask_path, val_mask_path) need format = "llmc"')
    bad = config(d, "no_shard", 1)
    bad["data"]["path"] = os.path.join(d, "nothing_*.bin")
    refused(checks, "glob matching nothing", d, bad, f"[data] path: {d}/nothing_*.bin: no such file")

    # 5. Epochs.
    sequences = (len(tokens) - 1) // T
    ep = config(d, "no_shard", 1, train__epochs=1.5)
    del ep["train"]["steps"]
    B = ep["train"]["batch_size"]
    _, ranks = harness.run(ep, 1)
    got = [s["epoch"] for s in ranks[0]["steps"]]
    want = [(i + 1) * B / sequences for i in range(math.ceil(1.5 * sequences / B))]
    checks.check(len(got) == len(want) and all(abs(g - w) <= 1e-12 for g, w in zip(got, want)),
                 f"epochs = 1.5 over {sequences} sequences runs {len(want)} steps of {B}, each reporting its epoch",
                 f"{len(got)} steps, epochs {got[:2]}..{got[-1:]}")
    bad = config(d, "no_shard", 1, train__epochs=2)
    refused(checks, "epochs beside steps", d, bad, "[train] epochs: give steps or epochs, not both")
    bad = harness.config("no_shard", 1, train__epochs=2)
    del bad["train"]["steps"]
    refused(checks, "epochs of synthetic data", d, bad, "[train] epochs: synthetic data is an endless stream")
    checks.finish()


if __name__ == "__main__":
    main()
