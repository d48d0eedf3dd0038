"""An hf export generates as its source model did (issue 27).

A tiny Qwen3 with a word-level tokenizer whose chat template ends each turn
with </s>, and a generation_config.json naming </s> as the end token, saved
by transformers as a model directory is; a LoRA job trains on it from that
directory; `shardctl ckpt export --format hf --merge` writes the merged model.

- config.json declares the source's eos and bos token ids (they were null);
- the tokenizer (with its chat template) and generation_config.json are
  copied beside the weights, and shardctl says from where;
- loaded with from_pretrained and the copied tokenizer, generate() stops at
  the chat template's end token: a logits processor makes </s> the 3rd new
  token, and generation ends right there instead of running to
  max_new_tokens (without the copied generation settings and ids it ran on);
- with the source directory gone, the export still succeeds and says that
  no tokenizer was copied; --tokenizer DIR names one; a --tokenizer that is
  not a directory is refused naming it.
"""
import json
import os
import shutil
import subprocess

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor, \
    LogitsProcessorList, Qwen3Config, Qwen3ForCausalLM

import harness
from prepare import make_tokenizer

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")


class ForceAt(LogitsProcessor):
    """Makes `token` the n-th generated token (the weights are random)."""

    def __init__(self, prompt_len, n, token):
        self.at, self.token = prompt_len + n - 1, token

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.at:
            scores[:] = -float("inf")
            scores[:, self.token] = 0
        return scores


def make_model(d):
    tok = make_tokenizer(d, chat=True)
    eos = tok.convert_tokens_to_ids("</s>")
    cfg = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, do_sample=False).save_pretrained(d)
    return tok, eos


def export(step_dir, out, *extra):
    return subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--merge", "--out", out, *extra],
                          capture_output=True, text=True, timeout=120)


def main():
    c = harness.Checks()
    torch.set_num_threads(1)
    work = harness.scratch_dir("shardline-export-generate-")
    src = os.path.join(work, "qwen3")
    tok, eos = make_model(src)
    cfg = harness.config("full_shard", 2, train__steps=3)
    cfg["model"] = {"hf_dir": src, "block_size": 16}
    cfg["lora"] = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    ckpt = os.path.join(work, "ckpt")
    harness.run(cfg, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", "3"])
    step_dir = os.path.join(ckpt, "tiny", "step-00000003")

    out = os.path.join(work, "merged")
    r = export(step_dir, out)
    c.check(r.returncode == 0 and src in r.stdout and "tokenizer" in r.stdout, "merged export with the tokenizer",
            (r.stdout + r.stderr).strip())
    with open(os.path.join(out, "config.json")) as f:
        conf = json.load(f)
    c.check(conf.get("eos_token_id") == eos and conf.get("bos_token_id") == eos,
            "config.json declares the source's token ids", f"{conf.get('bos_token_id')}, {conf.get('eos_token_id')}")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        c.check(os.path.exists(os.path.join(out, name)), f"{name} copied")

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    loaded = AutoTokenizer.from_pretrained(out)
    c.check(loaded.chat_template == tok.chat_template, "the copied tokenizer keeps its chat template")
    prompt = loaded.apply_chat_template([{"role": "user", "content": "why the cat sat"}], add_generation_prompt=True,
                                        return_tensors="pt")
    if not torch.is_tensor(prompt):  # transformers 5 returns a BatchEncoding
        prompt = prompt["input_ids"]
    n = prompt.shape[1]
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=12, do_sample=False,
                             logits_processor=LogitsProcessorList([ForceAt(n, 3, eos)]))
    c.check(gen.shape[1] == n + 3 and int(gen[0, -1]) == eos,
            "generate() stops at the chat template's end token", f"{gen.shape[1] - n} new tokens: {gen[0, n:].tolist()}")

    # The source directory gone: the export says so; --tokenizer names one.
    moved = src + "-moved"
    shutil.move(src, moved)
    r = export(step_dir, os.path.join(work, "no-source"))
    # (merge needs the base weights: without them the export fails naming them)
    c.check(r.returncode != 0 and moved not in r.stderr and src in r.stderr,
            "a merged export without its base is refused naming the base", r.stderr.strip())
    shutil.move(moved, src)
    tok_only = os.path.join(work, "tokenizer-only")
    os.makedirs(tok_only)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), tok_only)
    os.rename(os.path.join(src, "tokenizer.json"), os.path.join(work, "tokenizer.json.away"))
    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"):
        if os.path.exists(os.path.join(src, name)):
            os.rename(os.path.join(src, name), os.path.join(work, name + ".away"))
    r = export(step_dir, os.path.join(work, "bare"))
    c.check(r.returncode == 0 and "no tokenizer copied" in r.stdout and "--tokenizer" in r.stdout,
            "a source without a tokenizer: exported, saying none was copied", r.stdout.strip())
    r = export(step_dir, os.path.join(work, "given"), "--tokenizer", tok_only)
    c.check(r.returncode == 0 and sorted(f for f in os.listdir(os.path.join(work, "given")) if "token" in f) ==
            ["tokenizer.json", "tokenizer_config.json"], "--tokenizer DIR is copied", r.stdout.strip())
    r = export(step_dir, os.path.join(work, "refused"), "--tokenizer", os.path.join(work, "nowhere"))
    c.check(r.returncode == 1 and "--tokenizer" in r.stderr and "nowhere" in r.stderr and
            len(r.stderr.strip().splitlines()) == 1, "a --tokenizer that is not there is refused naming it",
            r.stderr.strip())
    c.finish()


if __name__ == "__main__":
    main()
