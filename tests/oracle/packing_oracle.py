"""Oracle: packed documents (`[data] doc_path`) compute what each document
computes alone, with transformers (Llama 3 shaped, RoPE from position ids)
and nanoGPT (learned positions) run on each document separately.

The stream holds documents of 3 to 21 tokens (block_size 16: some end inside
a sequence, some cross into the next one, whose piece is then a document of
its own, as TRL's wrapped packing cuts it).
1. Step 0 in fp32, one process: the engine's logits of the packed batch are
   each document's logits run alone (within 1e-5), its loss is the sum of the
   documents' cross-entropies over the targets that stay inside a document,
   divided by their count (within 1e-6), and every gradient is the
   gradient of that loss (within 1e-4): step0.py's tolerances, the same
   arithmetic in other orders. The target that crosses into the next document
   is ignored.
2. Packing matters: the same batch without doc_path gives another loss.
3. full_shard at N = 3 ends ten steps within equivalence.py's 2e-5 of one
   process (the positions and masks follow every rank's share of the batch).
4. A document-starts file of the wrong length or with a byte other than 0 or
   1 is refused, naming the file.
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import harness  # noqa: E402
from llama_oracle import hf_model  # noqa: E402
from nanogpt import model_from  # noqa: E402
from step0 import check_step0  # noqa: E402

torch.set_num_threads(1)
DOCS_MAGIC = 20241126


def write_stream(d, vocab, n_tokens, seed=7):
    """Token and document-starts files: documents of 3..21 tokens back to back."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, n_tokens)
    starts = np.zeros(n_tokens, dtype=np.uint8)
    i = 0
    while i < n_tokens:
        starts[i] = 1
        i += int(rng.integers(3, 22))
    harness.write_llmc(os.path.join(d, "train.bin"), tokens)
    harness.write_llmc(os.path.join(d, "train.docs"), starts, magic=DOCS_MAGIC, dtype=np.uint8)
    return starts


def pieces(positions):
    """[(start, end)] of each document piece in a row: it begins where the position is 0."""
    cuts = [int(t) for t in torch.nonzero(positions == 0).flatten()] + [len(positions)]
    return list(zip(cuts[:-1], cuts[1:]))


def run_alone(model, x, y, positions, logits_of):
    """Each document of each row alone: its logits (assembled into [B, T, V])
    and the summed cross-entropy over its targets."""
    rows = []
    total = 0.0
    for r in range(x.size(0)):
        parts = []
        for s, e in pieces(positions[r]):
            lg = logits_of(model, x[r:r + 1, s:e])
            parts.append(lg)
            total = total + F.cross_entropy(lg[0].float(), y[r, s:e], ignore_index=-100, reduction="sum")
        rows.append(torch.cat(parts, 1))
    return torch.cat(rows, 0), total


def hf_logits(model, x):
    return model(input_ids=x).logits


def gpt_logits(model, x):
    return model(x)[0]


def family_config(d, family, strategy="no_shard", world=1):
    cfg = harness.config(strategy, world, micro_batches=2)
    if family == "llama":
        cfg["model"] = harness.llama_model("llama3")
    cfg["data"] = {"format": "llmc", "path": os.path.join(d, "train.bin"), "doc_path": os.path.join(d, "train.docs")}
    return cfg


def step0(checks, d, family):
    cfg = family_config(d, family)
    m = cfg["model"]
    out = os.path.join(d, f"dump-{family}.safetensors")
    job = os.path.join(d, f"job-{family}.toml")
    harness.write_toml(cfg, job)
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", out], check=True, timeout=120)
    dump = load_file(out)
    x, y, pos = dump["batch.inputs"], dump["batch.targets"], dump["batch.positions"]
    starts_inside = int((pos[:, 1:] == 0).sum())
    crossing = int(((pos[:, 1:] == 0) & (y[:, :-1] == -100)).sum())
    checks.check(starts_inside > 0 and crossing == starts_inside,
                 f"{family}: every target that crosses into the next document is ignored",
                 f"{crossing} of {starts_inside} documents starting inside a sequence")
    if family == "llama":
        m.setdefault("head_dim", m["n_embd"] // m["n_head"])
        model = hf_model("llama3", m)
        state = {k: v for k, v in dump.items() if k.startswith(("model.", "lm_head."))}
        model.load_state_dict(state, strict=False)
        logits_of = hf_logits
    else:
        model = model_from(dump, m)
        logits_of = gpt_logits
    logits, total = run_alone(model, x, y, pos, logits_of)
    loss = total / int((y != -100).sum())
    check_step0(checks, dump, model, logits, loss, f"{family} packed, each document alone: ")
    return cfg


def main():
    checks = harness.Checks()
    d = harness.scratch_dir("shardline-packing-")
    vocab = harness.TINY["model"]["vocab_size"]
    write_stream(d, vocab, 4000)
    for family in ("llama", "gpt"):
        cfg = step0(checks, d, family)

    # 2. Without the document starts the same batch is one document per sequence.
    plain = dict(cfg, data={k: v for k, v in cfg["data"].items() if k != "doc_path"})
    job = os.path.join(d, "job-plain.toml")
    harness.write_toml(plain, job)
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", os.path.join(d, "plain.safetensors")],
                   check=True, timeout=120)
    a, b = load_file(os.path.join(d, "dump-gpt.safetensors")), load_file(os.path.join(d, "plain.safetensors"))
    diff = float((a["logits"] - b["logits"]).abs().max())
    checks.check(torch.equal(a["batch.inputs"], b["batch.inputs"]) and diff > 1e-3 and "batch.positions" not in b,
                 "packing changes what is computed: the same batch unpacked has other logits",
                 f"max abs diff {diff:.2e}")
    packed_out, _ = harness.run(cfg, 1)

    # 3. Sharded at N = 3 (each rank its own share of positions and masks).
    ref = harness.load_params(packed_out)
    out3, _ = harness.run(family_config(d, "gpt", "full_shard", 3), 3)
    got = harness.load_params(out3)
    diff, _ = harness.param_diffs(got, ref)
    checks.check(diff <= 2e-5, "packed: full_shard N=3 ends 10 steps as one process does",
                 f"max abs diff {diff:.2e} (tol 2e-5)")

    # 4. Bad document-starts files are refused, naming the file.
    for name, values, want in (("short.docs", np.ones(10, dtype=np.uint8), "of 10 entries for"),
                               ("bytes.docs", np.full(4000, 2, dtype=np.uint8), "byte 2 at position 0")):
        path = os.path.join(d, name)
        harness.write_llmc(path, values, magic=DOCS_MAGIC, dtype=np.uint8)
        bad = dict(cfg, data=dict(cfg["data"], doc_path=path))
        job = os.path.join(d, f"bad-{name}.toml")
        harness.write_toml(bad, job)
        p = subprocess.run([harness.TRAIN, "--config", job, "--out", d], capture_output=True, text=True, timeout=60)
        checks.check(p.returncode != 0 and path in p.stderr and want in p.stderr,
                     f"a document-starts file with {name.split('.')[0]} entries is refused naming it",
                     p.stderr.strip()[-200:])
    checks.finish()


if __name__ == "__main__":
    main()
