"""client/prepare_data.py: JSONL to token and mask files with a model's own
tokenizer (a small word-level tokenizer with a chat template, saved by
transformers as a model directory would hold it).

- completion: exactly the completion's tokens and the end-of-sequence token
  count, record by record; shards split at --shard-tokens, read back as one
  stream equal to the tokenizer's encoding of every record in order.
- chat: exactly the assistant turns count (what the template adds after the
  generation prompt), every user turn and the template's own tokens do not.
- --val-fraction sends some records to val files.
- A job trains on the files (path, mask_path, val_path as globs) with the
  loss the masks imply.
- Bad input is one line naming the file and line: not JSON, a missing key, a
  chat record for a tokenizer without a chat template.
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import harness

PREPARE = os.path.join(os.path.dirname(__file__), "..", "..", "client", "prepare_data.py")
WORDS = "the a cat dog sat ran on under mat log why how what is it yes no maybe blue red".split()
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def make_tokenizer(d, chat=True):
    specials = ["<unk>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="</s>",
                                  additional_special_tokens=specials[2:])
    if chat:
        tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    return tok


def read(path, width=None):
    h = np.fromfile(path, dtype=np.int32, count=256)
    dtype = {20240520: np.uint16, 20240801: np.uint32, 20240905: np.uint8, 20241126: np.uint8}[int(h[0])]
    return np.fromfile(path, dtype=dtype, offset=1024)[:h[2]]


def stream(prefix, split, ext):
    files = sorted(glob.glob(f"{prefix}_{split}_*.{ext}"))
    return files, (np.concatenate([read(f) for f in files]) if files else np.zeros(0))


def prepare(*args):
    return subprocess.run([sys.executable, PREPARE, *args], capture_output=True, text=True, timeout=300)


def main():
    checks = harness.Checks()
    d = harness.scratch_dir("shardline-prepare-")
    tok_dir = os.path.join(d, "model")
    tok = make_tokenizer(tok_dir)
    rng = np.random.default_rng(0)
    sentence = lambda: " ".join(rng.choice(WORDS, rng.integers(2, 9)))

    # completion
    pairs = [{"prompt": sentence(), "completion": sentence()} for _ in range(40)]
    with open(os.path.join(d, "pairs.jsonl"), "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in pairs)
    prefix = os.path.join(d, "out", "pairs")
    r = prepare("--tokenizer", tok_dir, "--input", os.path.join(d, "pairs.jsonl"), "--out", prefix,
                "--format", "completion", "--shard-tokens", "100", "--pack")
    checks.check(r.returncode == 0, "completion: prepared", r.stderr.strip())
    files, tokens = stream(prefix, "train", "bin")
    _, mask = stream(prefix, "train", "mask")
    doc_files, docs = stream(prefix, "train", "docs")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    want_tokens, want_mask, want_docs = [], [], []
    for p in pairs:
        n = len(enc(p["prompt"]) + enc(p["completion"])) + 1
        want_tokens += enc(p["prompt"]) + enc(p["completion"]) + [eos]
        want_mask += [0] * len(enc(p["prompt"])) + [1] * (len(enc(p["completion"])) + 1)
        want_docs += [1] + [0] * (n - 1)
    checks.check(len(doc_files) == len(files) and docs.tolist() == want_docs,
                 "--pack: a .docs file per shard, 1 exactly at each record's first token",
                 f"{len(doc_files)} files for {len(files)}, {int(docs.sum())} starts for {len(pairs)} records")
    checks.check(len(files) > 1 and all(len(read(f)) <= 100 for f in files), "completion: shards of <= 100 tokens",
                 f"{len(files)} files")
    checks.check(tokens.tolist() == want_tokens, "completion: the stream is every record's tokens in order")
    checks.check(mask.tolist() == want_mask, "completion: exactly the completions and their EOS count",
                 f"{int(mask.sum())} of {len(mask)}")

    # chat
    chats = []
    for _ in range(30):
        turns = [{"role": "system", "content": sentence()}] if rng.random() < 0.5 else []
        for _ in range(rng.integers(1, 4)):
            turns += [{"role": "user", "content": sentence()}, {"role": "assistant", "content": sentence()}]
        chats.append({"messages": turns})
    with open(os.path.join(d, "chats.jsonl"), "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in chats)
    prefix = os.path.join(d, "out", "chats")
    r = prepare("--tokenizer", tok_dir, "--input", os.path.join(d, "chats.jsonl"), "--out", prefix, "--format", "chat")
    checks.check(r.returncode == 0, "chat: prepared", r.stderr.strip())
    _, tokens = stream(prefix, "train", "bin")
    _, mask = stream(prefix, "train", "mask")
    counted = [int(t) for t, m in zip(tokens, mask) if m]
    want = []
    for c in chats:
        for m in c["messages"]:
            if m["role"] == "assistant":
                want += enc(m["content"]) + [eos]
    checks.check(counted == want, "chat: exactly the assistant turns (and their end-of-turn) count",
                 f"{len(counted)} of {len(tokens)} tokens")

    # val split, then a job on the files.
    prefix = os.path.join(d, "out", "split")
    r = prepare("--tokenizer", tok_dir, "--input", os.path.join(d, "chats.jsonl"), "--out", prefix, "--format", "chat",
                "--val-fraction", "0.3", "--shard-tokens", "300", "--pack")
    val_files, val = stream(prefix, "val", "bin")
    _, train = stream(prefix, "train", "bin")
    checks.check(r.returncode == 0 and val_files and len(train) > len(val) > 0, "--val-fraction writes val files",
                 f"train {len(train)}, val {len(val)} tokens")
    # A .txt file is one document: --val-fraction splits its tokens, the last
    # quarter to val (drawing the one record would send all or none there).
    with open(os.path.join(d, "book.txt"), "w") as f:
        f.write(" ".join(f"word{i % 37}" for i in range(400)))
    book = os.path.join(d, "out", "book")
    r = prepare("--tokenizer", tok_dir, "--input", os.path.join(d, "book.txt"), "--out", book, "--val-fraction", "0.25")
    _, btrain = stream(book, "train", "bin")
    _, bval = stream(book, "val", "bin")
    total = len(btrain) + len(bval)
    checks.check(r.returncode == 0 and total > 0 and abs(len(bval) - round(0.25 * total)) <= 1,
                 "--val-fraction of a .txt document puts its last quarter of tokens in val",
                 f"train {len(btrain)}, val {len(bval)} tokens {r.stderr.strip()}")
    cfg = harness.config("full_shard", 2, micro_batches=1, train__steps=3, train__batch_size=4,
                         train__eval_interval=3, train__eval_batches=1)
    cfg["model"] = {**harness.llama_model("qwen3"), "vocab_size": len(tok), "block_size": 16}
    cfg["data"] = {"format": "llmc", "path": prefix + "_train_*.bin", "mask_path": prefix + "_train_*.mask",
                   "val_path": prefix + "_val_*.bin", "val_mask_path": prefix + "_val_*.mask",
                   "doc_path": prefix + "_train_*.docs", "val_doc_path": prefix + "_val_*.docs"}
    cfg["train"]["micro_batch_size"] = 2
    try:
        _, ranks = harness.run(cfg, 2)
        steps = ranks[0]["steps"]
        ok = len(steps) == 3 and all(np.isfinite(s["loss"]) for s in steps) and steps[-1]["val_loss"] is not None
        checks.check(ok, "a job trains on the prepared shards, masks, document starts and val files",
                     f"loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, val {steps[-1]['val_loss']:.3f}")
    except harness.RunError as e:
        checks.check(False, "a job trains on the prepared shards, masks, document starts and val files", str(e))

    # bad input
    bad = os.path.join(d, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(pairs[0]) + "\n{not json\n")
    r = prepare("--tokenizer", tok_dir, "--input", bad, "--out", prefix, "--format", "completion")
    checks.check(r.returncode == 1 and f"{bad}:2: not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
                 "not JSON: named by file and line", r.stderr.strip())
    with open(bad, "w") as f:
        f.write(json.dumps({"prompt": "a"}) + "\n")
    r = prepare("--tokenizer", tok_dir, "--input", bad, "--out", prefix, "--format", "completion")
    checks.check(r.returncode == 1 and f'{bad}:1: needs "completion"' in r.stderr, "a missing key is named",
                 r.stderr.strip())
    plain = os.path.join(d, "plain")
    make_tokenizer(plain, chat=False)
    r = prepare("--tokenizer", plain, "--input", os.path.join(d, "chats.jsonl"), "--out", prefix, "--format", "chat")
    checks.check(r.returncode == 1 and "has no chat template" in r.stderr, "chat without a chat template refused",
                 r.stderr.strip())
    planted_links(checks, d, tok_dir)
    checks.finish()


def planted_links(checks, d, tok_dir):
    """Links planted where prepare_data writes (its old temporary name, the
    output's own name) are never written through: the files they name keep
    their bytes, and the outputs are regular files."""
    victims = {}
    for name in ("victim-tmp", "victim-out"):
        victims[name] = os.path.join(d, name)
        with open(victims[name], "wb") as f:
            f.write(b"the victim's bytes")
    prefix = os.path.join(d, "planted", "p")
    os.makedirs(os.path.dirname(prefix))
    os.symlink(victims["victim-tmp"], prefix + "_train_000000.bin.tmp")
    os.symlink(victims["victim-out"], prefix + "_train_000000.bin")
    text = os.path.join(d, "planted.txt")
    with open(text, "w") as f:
        f.write(" ".join(WORDS * 4))
    r = prepare("--tokenizer", tok_dir, "--input", text, "--out", prefix)
    out = prefix + "_train_000000.bin"
    checks.check(r.returncode == 0 and all(open(v, "rb").read() == b"the victim's bytes" for v in victims.values()),
                 "links planted at the temporary and the output names: their targets unchanged", r.stderr.strip())
    checks.check(os.path.isfile(out) and not os.path.islink(out) and len(read(out)) > 0,
                 "the output is a regular file of tokens, not the link")


if __name__ == "__main__":
    main()
