#!/usr/bin/env python3
"""shardline prepare-data: text or JSONL to llm.c token files and loss masks,
with the model's own tokenizer (its Hugging Face directory).

    prepare_data.py --tokenizer HF_DIR --input FILE --out PREFIX
                    [--format text|completion|chat] [--shard-tokens N]
                    [--val-fraction F] [--seed S] [--pack]

Formats (one record per line of a .jsonl file; a .txt file is one document):
  text        {"text": ...}: every token counts (no mask files written)
  completion  {"prompt": ..., "completion": ...}: only the completion and the
              end-of-sequence token count
  chat        {"messages": [{"role": ..., "content": ...}, ...]}: rendered with
              the tokenizer's chat template; only the assistant turns count
              (what the template adds for each assistant message after the
              generation prompt)

Each record's tokens are followed by the tokenizer's end-of-sequence token
(chat templates that end turns themselves are left as they are). Writes
PREFIX_train_000000.bin (+ .mask) and so on, shards of at most --shard-tokens
tokens, and PREFIX_val_*.bin for a --val-fraction of the records (chosen by
--seed); a .txt file, one document, is split instead: its last --val-fraction
of tokens go to val. Token files are llm.c's GPT-2 format (uint16) for vocabularies up to
65,536, else its Llama 3 format (uint32). Masks: a 256 x int32 header (magic
20240905, version 1, count), then one byte per token, 1 where the token counts
as a target. The job file then names them:

    [data]
    format = "llmc"
    path = "PREFIX_train_*.bin"
    mask_path = "PREFIX_train_*.mask"
    val_path = "PREFIX_val_*.bin"
    val_mask_path = "PREFIX_val_*.mask"

--pack also writes PREFIX_train_000000.docs and so on: a 256 x int32 header
(magic 20241126, version 1, count), then one byte per token, 1 where a record
(a document) begins. Named in the job file as

    doc_path = "PREFIX_train_*.docs"
    val_doc_path = "PREFIX_val_*.docs"

they keep the documents packed into each sequence apart: attention stays
within a document, positions restart at each, and no document's first token
is a target of the one before (what TRL's packing with position ids does).

Every error is one line naming the file and the record (line number).
"""
import argparse
import json
import os
import random
import sys
import tempfile

import numpy as np

TOKENS_GPT2 = (20240520, 1, np.uint16)
TOKENS_LLAMA3 = (20240801, 7, np.uint32)
MASK = (20240905, 1, np.uint8)
DOCS = (20241126, 1, np.uint8)


class InputError(Exception):
    pass


def write_llmc(path, values, kind):
    magic, version, dtype = kind
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (magic, version, len(values))
    # A temporary file of a fresh random name, created exclusively (O_EXCL:
    # never through a link planted beside the output), then renamed over the
    # output (a link there is replaced, not followed).
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(values, dtype=dtype).tobytes())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def records(path, fmt):
    """(where, record) pairs: where names the file and line."""
    if path.endswith(".txt"):
        if fmt != "text":
            raise InputError(f"{path}: a .txt file is one document; --format {fmt} needs .jsonl")
        with open(path, encoding="utf-8") as f:
            yield path, {"text": f.read()}
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: not JSON: {e.msg}")
            if not isinstance(rec, dict):
                raise InputError(f"{where}: expected a JSON object")
            yield where, rec


def field(where, rec, key, kind=str):
    if key not in rec or not isinstance(rec[key], kind):
        raise InputError(f"{where}: needs \"{key}\" ({'a string' if kind is str else 'a list'})")
    return rec[key]


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def tokens_of(tok, fmt, where, rec, eos):
    """(tokens, mask) of one record."""
    if fmt == "text":
        ids = encode(tok, field(where, rec, "text")) + eos
        return ids, [1] * len(ids)
    if fmt == "completion":
        prompt = encode(tok, field(where, rec, "prompt"))
        completion = encode(tok, field(where, rec, "completion")) + eos
        return prompt + completion, [0] * len(prompt) + [1] * len(completion)
    messages = field(where, rec, "messages", list)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"{where}: messages[{i}] needs \"role\" and \"content\" strings")
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:i], tokenize=True, add_generation_prompt=True, return_dict=False)
        through = tok.apply_chat_template(messages[:i + 1], tokenize=True, return_dict=False)
        if through[:len(before)] != before or ids[:len(through)] != through:
            raise InputError(f"{where}: the chat template does not render messages[{i}] as a continuation of "
                             "the turns before it, so its tokens cannot be masked")
        mask[len(before):len(through)] = [1] * (len(through) - len(before))
    return ids, mask


class ShardWriter:
    def __init__(self, prefix, split, shard_tokens, token_kind, masked, packed):
        self.prefix, self.split, self.shard_tokens = prefix, split, shard_tokens
        self.token_kind, self.masked, self.packed = token_kind, masked, packed
        self.tokens, self.mask, self.docs, self.files, self.total = [], [], [], [], 0

    def add(self, tokens, mask):
        """One document's tokens (and loss mask)."""
        self.tokens += tokens
        self.mask += mask
        self.docs += [1] + [0] * (len(tokens) - 1) if tokens else []
        while len(self.tokens) >= self.shard_tokens:
            self.flush(self.shard_tokens)

    def flush(self, n=None):
        n = len(self.tokens) if n is None else n
        if n == 0:
            return
        base = f"{self.prefix}_{self.split}_{len(self.files):06d}"
        write_llmc(base + ".bin", self.tokens[:n], self.token_kind)
        if self.masked:
            write_llmc(base + ".mask", self.mask[:n], MASK)
        if self.packed:
            write_llmc(base + ".docs", self.docs[:n], DOCS)
        self.files.append(base + ".bin")
        self.total += n
        self.tokens, self.mask, self.docs = self.tokens[n:], self.mask[n:], self.docs[n:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face model or tokenizer directory")
    ap.add_argument("--input", required=True, help="a .txt or .jsonl file")
    ap.add_argument("--out", required=True, help="output prefix (folder/name)")
    ap.add_argument("--format", default="text", choices=["text", "completion", "chat"])
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--val-fraction", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--pack", action="store_true",
                    help="also write .docs files: the documents packed into a sequence stay apart")
    a = ap.parse_args(argv)
    try:
        if a.shard_tokens < 1 or not 0 <= a.val_fraction < 1:
            raise InputError("--shard-tokens must be >= 1 and --val-fraction in [0, 1)")
        if not os.path.isfile(a.input):
            raise InputError(f"{a.input}: no such file")
        from transformers import AutoTokenizer  # slow to import: after the cheap checks
        try:
            tok = AutoTokenizer.from_pretrained(a.tokenizer)
        except (OSError, ValueError) as e:
            raise InputError(f"{a.tokenizer}: no tokenizer: {str(e).splitlines()[0]}")
        if a.format == "chat" and not tok.chat_template:
            raise InputError(f"{a.tokenizer}: the tokenizer has no chat template (needed by --format chat)")
        vocab = len(tok)
        kind = TOKENS_GPT2 if vocab <= 65536 else TOKENS_LLAMA3
        eos = [tok.eos_token_id] if tok.eos_token_id is not None and a.format != "chat" else []
        masked = a.format != "text"
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        writers = {s: ShardWriter(a.out, s, a.shard_tokens, kind, masked, a.pack) for s in ("train", "val")}
        rng = random.Random(a.seed)
        counted = 0
        one_document = a.input.endswith(".txt")
        for where, rec in records(a.input, a.format):
            ids, mask = tokens_of(tok, a.format, where, rec, eos)
            if any(t >= vocab or t < 0 for t in ids):
                raise InputError(f"{where}: a token id outside the tokenizer's {vocab}")
            counted += sum(mask)
            if one_document and a.val_fraction > 0:
                # One record: drawing it for val would send all or nothing.
                cut = len(ids) - int(round(len(ids) * a.val_fraction))
                writers["train"].add(ids[:cut], mask[:cut])
                writers["val"].add(ids[cut:], mask[cut:])
                continue
            writers["val" if rng.random() < a.val_fraction else "train"].add(ids, mask)
        for w in writers.values():
            w.flush()
        if not writers["train"].files:
            raise InputError(f"{a.input}: no records")
    except InputError as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 1
    for s, w in writers.items():
        if w.files:
            print(f"{s}: {w.total} tokens in {len(w.files)} file(s) {w.files[0]} ...")
    print(f"{counted} tokens count as targets; vocabulary {vocab} ({'uint16' if kind is TOKENS_GPT2 else 'uint32'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
