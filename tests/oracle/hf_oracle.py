"""Oracle: Hugging Face directories in and out, against transformers (the
pinned version).

For tiny random Llama-3-, Qwen2- and Qwen3-shaped models and a GPT-2, each
written by transformers' save_pretrained in sharded files (fp32, bf16, fp16
and fp32 with a 64-row position table respectively), and read through
`[model] hf_dir` with no other [model] key but block_size:

1. Step 0 in one process: the engine's logits, loss and every gradient equal
   the from_pretrained model's in fp32 (check_step0).
2. Five steps of full_shard at N=3 (sizes that pad; each rank reads only the
   ranges it owns), saved, then `shardctl ckpt export --format hf` in small
   shards: from_pretrained loads it with no missing or unexpected keys, its
   weights equal the engine's final parameters bitwise, and a job started
   from the exported directory has the from_pretrained model's logits.
   A bf16 export holds the parameters rounded to bf16.
3. Bad directories and keys are refused by `shardctl submit` before it
   connects, each in one line naming the file or key.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import harness  # noqa: E402
from llama_oracle import hf_model  # noqa: E402
from step0 import check_step0  # noqa: E402

torch.set_num_threads(1)
SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
SAVE_DTYPE = {"llama3": torch.float32, "qwen2": torch.bfloat16, "qwen3": torch.float16, "gpt2": torch.float32}


def source_model(name):
    """A transformers model with its own random init (not the engine's)."""
    torch.manual_seed(7)
    if name == "gpt2":
        m = harness.TINY["model"]
        cfg = GPT2Config(n_embd=m["n_embd"], n_layer=m["n_layer"], n_head=m["n_head"], vocab_size=m["vocab_size"],
                         n_positions=64, bos_token_id=None, eos_token_id=None)
        return GPT2LMHeadModel(cfg).eval()
    m = harness.llama_model(name)
    m.setdefault("head_dim", m["n_embd"] // m["n_head"])
    model = hf_model(name, m)
    model.config.max_position_embeddings = 64
    # Not the default init's ones and zeros: norms and biases must load too.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1 if p.dim() == 2 else 0.5)
    return model


def write_job(dirname, hf_dir, strategy="no_shard", world=1, steps=5, **model_keys):
    cfg = harness.config(strategy, world, micro_batches=2, train__steps=steps)
    cfg["model"] = {"hf_dir": hf_dir, "block_size": 16, **model_keys}
    path = os.path.join(dirname, "job.toml")
    harness.write_toml(cfg, path)
    return cfg, path


def engine_dump(job):
    out = os.path.join(os.path.dirname(job), "dump.safetensors")
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", out], check=True, timeout=120)
    return load_file(out)


def step0(checks, name, hf_dir, dump):
    """The engine's step 0 against from_pretrained(hf_dir) in fp32."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    if name == "gpt2":  # the engine's [out, in] gradients, as Conv1D stores them
        dump = {k: (v.t() if k.startswith("grad.") and k.endswith(CONV1D) else v) for k, v in dump.items()}
        # The engine holds block_size positions; the rows after them get no gradient.
        wpe = dump["grad.transformer.wpe.weight"]
        rows = model.config.n_positions - wpe.size(0)
        dump["grad.transformer.wpe.weight"] = torch.cat([wpe, wpe.new_zeros(rows, wpe.size(1))])
    logits = model(input_ids=dump["batch.inputs"]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), dump["batch.targets"].reshape(-1))
    check_step0(checks, dump, model, logits, loss, f"{name}: hf_dir ")
    return model


def hf_state_as_engine(name, state):
    """An exported HF state in the engine's names and layouts."""
    out = {}
    for k, v in state.items():
        v = v.float()
        if name == "gpt2" and k.endswith(CONV1D):
            v = v.t().contiguous()
        out[k] = v
    return out


def round_trip(checks, name, hf_dir, work):
    cfg, job = write_job(work, hf_dir, "full_shard", 3)
    ckpt = os.path.join(work, "ckpt")
    run_out, _ = harness.run(cfg, 3, extra_args=["--ckpt-dir", ckpt, "--save-at", "5"])
    trained = load_file(os.path.join(run_out, "params.safetensors"))
    step_dir = os.path.join(ckpt, "tiny", "step-00000005")
    exported = os.path.join(work, "exported")
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--out", exported,
                        "--max-shard-size", "20KB"], capture_output=True, text=True)
    checks.check(r.returncode == 0, f"{name}: ckpt export --format hf", r.stderr.strip())
    files = sorted(os.listdir(exported))
    checks.check("model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1,
                 f"{name}: export is sharded with an index", f"{len(files)} files")
    model, info = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    checks.check(not problems, f"{name}: from_pretrained loads the export with no missing or unexpected keys",
                 str(problems))
    index = json.load(open(os.path.join(exported, "model.safetensors.index.json")))
    state = {}
    for f in set(index["weight_map"].values()):
        state.update(load_file(os.path.join(exported, f)))
    state = hf_state_as_engine(name, state)
    same = set(state) == set(trained) and all(torch.equal(state[k], trained[k]) for k in trained)
    checks.check(same, f"{name}: exported weights equal the engine's final parameters bitwise")
    # The exported directory in again: the engine's logits are from_pretrained's.
    again = os.path.join(work, "again")
    os.makedirs(again)
    _, job = write_job(again, exported)
    dump = engine_dump(job)
    with torch.no_grad():
        logits = model.eval()(input_ids=dump["batch.inputs"]).logits
    e = float((logits - dump["logits"]).abs().max() / logits.abs().max())
    checks.check(e < 1e-5, f"{name}: engine from the export has from_pretrained's logits", f"max rel error {e:.2e}")
    # bf16: the parameters rounded to nearest even, as torch casts.
    bf16 = os.path.join(work, "bf16")
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--out", bf16, "--dtype", "bf16"],
                       capture_output=True, text=True)
    state = hf_state_as_engine(name, load_file(os.path.join(bf16, "model.safetensors")))
    ok = r.returncode == 0 and all(torch.equal(state[k], trained[k].bfloat16().float()) for k in trained)
    cfg_dtype = json.load(open(os.path.join(bf16, "config.json"))).get("dtype")
    checks.check(ok and cfg_dtype == "bfloat16", f"{name}: --dtype bf16 export is the parameters cast to bf16",
                 r.stderr.strip())


def bad_inputs(checks, good_dir):
    """Each bad directory is a copy of a good one (llama3's) with one fault."""
    root = harness.scratch_dir("shardline-hf-bad-")

    def variant(tag, fault, **model_keys):
        d = os.path.join(root, tag, "model")
        shutil.copytree(good_dir, d)
        fault(d)
        _, job = write_job(os.path.dirname(d), d, **model_keys)
        return d, job

    def edit_config(d, **kv):
        path = os.path.join(d, "config.json")
        c = json.load(open(path))
        c.update(kv)
        json.dump(c, open(path, "w"))

    def index(d):
        return json.load(open(os.path.join(d, "model.safetensors.index.json")))

    d, job = variant("noconfig", lambda d: os.remove(os.path.join(d, "config.json")))
    harness.refused_at_submit(checks, "no config.json", job, f"{d}/config.json: cannot read [model] hf_dir config: No such file")
    _, job = variant("mixtral", lambda d: edit_config(d, model_type="mixtral", architectures=["MixtralForCausalLM"]))
    harness.refused_at_submit(checks, "unsupported architecture", job, 'model_type = "mixtral" is not supported')
    _, job = variant("window", lambda d: edit_config(d, model_type="mistral", sliding_window=8))
    harness.refused_at_submit(checks, "a sliding window shorter than block_size", job, "sliding_window: 8, shorter than block_size 16")
    _, job = variant("contradiction", lambda d: None, n_layer=3)
    harness.refused_at_submit(checks, "a [model] key contradicting config.json", job,
            "[model] n_layer = 3 contradicts")
    _, job = variant("toolong", lambda d: None, block_size=65)
    harness.refused_at_submit(checks, "block_size beyond max_position_embeddings", job,
            "block_size = 65 exceeds")

    def missing_shard(d):
        os.remove(os.path.join(d, sorted(set(index(d)["weight_map"].values()))[1]))
    _, job = variant("missing_shard", missing_shard)
    harness.refused_at_submit(checks, "a missing shard file", job, "cannot open")

    def ghost_tensor(d):
        i = index(d)
        i["weight_map"]["model.layers.0.mlp.ghost.weight"] = next(iter(i["weight_map"].values()))
        json.dump(i, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    _, job = variant("ghost", ghost_tensor)
    harness.refused_at_submit(checks, "an index naming a tensor its file lacks", job, "maps tensor model.layers.0.mlp.ghost.weight to")

    def rewrite(d, name, fn):
        from safetensors.torch import save_file
        f = index(d)["weight_map"][name]
        path = os.path.join(d, f)
        tensors = load_file(path)
        tensors[name] = fn(tensors[name])
        save_file(tensors, path, metadata={"format": "pt"})
    _, job = variant("shape", lambda d: rewrite(d, "model.norm.weight", lambda t: torch.ones(t.numel() + 1)))
    harness.refused_at_submit(checks, "a weight of the wrong shape", job, "tensor model.norm.weight has shape [33], the model needs [32]")
    _, job = variant("dtype", lambda d: rewrite(d, "model.norm.weight", lambda t: t.to(torch.int32)))
    harness.refused_at_submit(checks, "a weight of the wrong dtype", job, "tensor model.norm.weight is I32")


def main():
    checks = harness.Checks()
    dirs = {}
    for name in [*harness.LLAMA_MODELS, "gpt2"]:
        work = harness.scratch_dir(f"shardline-hf-{name}-")
        hf_dir = os.path.join(work, "source")
        source_model(name).to(SAVE_DTYPE[name]).save_pretrained(hf_dir, max_shard_size="20KB")
        dirs[name] = hf_dir
        _, job = write_job(work, hf_dir)
        step0(checks, name, hf_dir, engine_dump(job))
        round_trip(checks, name, hf_dir, work)
    bad_inputs(checks, dirs["llama3"])
    checks.finish()


if __name__ == "__main__":
    main()
