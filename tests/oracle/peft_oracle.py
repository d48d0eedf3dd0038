"""Oracle: LoRA against PEFT (the pinned version) on transformers models.

Three bases, each a transformers save_pretrained directory with its own
random weights read through [model] hf_dir: a Llama-3-shaped model (GQA,
untied head; adapters on every projection), a Qwen2-shaped one (q/k/v
biases, tied; PEFT's default targets q_proj and v_proj) and a GPT-2 (Conv1D;
c_attn and both c_proj). Adapters start from a directory PEFT saved with a
random, non-zero lora_B ([lora] init_from), so that every adapter has a
gradient from step 0.

1. Ten steps at N=1..4 under every strategy family and both base
   placements ([lora] base = sharded | replicated), activation checkpointing
   once: the losses equal PeftModel + torch.optim.AdamW + clip_grad_norm_ +
   the schedule within 1e-5 (relative) and the final adapters within 2e-5.
2. PEFT's default initialisation (no init_from): lora_B zero, lora_A inside
   the Kaiming bound 1/sqrt(in), the same at N=1 and N=3; step 0's loss is the
   base model's, as B = 0 makes the adapted model the base.
3. Checkpoints hold adapters only and resume at another world size and
   strategy; resuming without [lora], or with another rank, is refused.
4. `ckpt export --format peft` loads with PeftModel.from_pretrained (its
   tensors are exactly PEFT's adapter keys, bitwise the engine's adapters)
   and gives the logits of the one-process PEFT model trained alongside;
   `--format hf --merge` loads with from_pretrained and has the PeftModel's
   logits.
5. Bad [lora] keys and adapter directories are refused by `shardctl submit`
   in one line naming the key or file.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import harness  # noqa: E402
from hf_oracle import SHARDCTL, source_model  # noqa: E402
from llama_oracle import hf_loss  # noqa: E402
from nanogpt import train_reference  # noqa: E402

torch.set_num_threads(1)
STEPS = 10
# name -> ([lora] keys, the runs (strategy, world, base placement, activation checkpointing))
CASES = {
    "llama3": ({"rank": 4, "alpha": 8, "target_modules": "all-linear"},
               [("no_shard", 1, "sharded", False), ("full_shard", 2, "sharded", True),
                ("full_shard", 3, "replicated", False), ("hybrid_shard", 4, "sharded", False),
                ("zero1", 2, "replicated", False), ("shard_grad_op", 4, "sharded", False)]),
    "qwen2": ({"rank": 2, "alpha": 4}, [("no_shard", 1, "sharded", False), ("full_shard", 3, "sharded", False)]),
    "gpt2": ({"rank": 4, "alpha": 16, "target_modules": ["c_attn", "c_proj"]},
             [("no_shard", 1, "replicated", False), ("full_shard", 2, "sharded", False)]),
}


def peft_targets(name, lora):
    t = lora.get("target_modules")
    if t == "all-linear":
        return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return t or ("q_proj", "v_proj")


def base_model(hf_dir):
    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def make_adapters(name, hf_dir, lora, out):
    """A PEFT adapter directory for hf_dir with random A and B."""
    torch.manual_seed(11)
    model = get_peft_model(base_model(hf_dir), LoraConfig(
        r=lora["rank"], lora_alpha=lora["alpha"], target_modules=list(peft_targets(name, lora)), lora_dropout=0.0,
        fan_in_fan_out=name == "gpt2"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    model.save_pretrained(out)


def job(work, hf_dir, lora, strategy="no_shard", world=1, base="sharded", ckpt=False, **lora_keys):
    cfg = harness.config(strategy, world, micro_batches=2, train__steps=STEPS)
    cfg["model"] = {"hf_dir": hf_dir, "block_size": 16}
    cfg["optimizer"]["lr"] = 3e-3
    cfg["memory"]["activation_checkpointing"] = ckpt
    if lora is not None:
        cfg["lora"] = {"base": base, **lora, **lora_keys}
    path = os.path.join(work, "job.toml")
    harness.write_toml(cfg, path)
    return cfg, path


def batches(work, hf_dir):
    """Every step's global batch, from a dump of the same job without LoRA."""
    _, path = job(work, hf_dir, None)
    out = os.path.join(work, "dump.safetensors")
    subprocess.run([harness.TRAIN, "--config", path, "--dump-grads", out], check=True, timeout=120,
                   capture_output=True)
    return load_file(out)


def peft_name(engine_name):
    """The PeftModel parameter of an engine adapter name."""
    return "base_model.model." + engine_name.replace(".weight", ".default.weight")


def reference(hf_dir, adapters, cfg, dump):
    model = PeftModel.from_pretrained(base_model(hf_dir), adapters, is_trainable=True).eval()
    params, losses = train_reference(dump, cfg, model=model, loss_of=hf_loss)
    return params, losses


def max_diff(engine, ref):
    return max(float((v - ref[peft_name(k)]).abs().max()) for k, v in engine.items())


def equivalence(checks, name, work, hf_dir, lora, adapters, dump):
    lora = {**lora, "init_from": adapters}
    cfg, _ = job(work, hf_dir, lora)
    ref, ref_losses = reference(hf_dir, adapters, cfg, dump)
    for strategy, world, base, ac in CASES[name][1]:
        cfg, _ = job(work, hf_dir, lora, strategy, world, base, ac)
        out, ranks = harness.run(cfg, world)
        params = harness.load_params(out)
        params = {k: torch.from_numpy(v) for k, v in params.items()}
        losses = [s["loss"] for s in ranks[0]["steps"]]
        label = f"{name}: {strategy} N={world} base {base}{' ac' if ac else ''} vs PEFT"
        lrel = max(abs(a - b) / b for a, b in zip(losses, ref_losses))
        checks.check(len(losses) == STEPS and lrel < 1e-5, f"{label}: losses", f"max rel diff {lrel:.2e}")
        diff = max_diff(params, ref)
        checks.check(diff < 2e-5, f"{label}: adapters", f"max abs diff {diff:.2e}")
        moved = max(float((params[k] - load_file(os.path.join(adapters, "adapter_model.safetensors"))[
            "base_model.model." + k]).abs().max()) for k in params)
        checks.check(moved > 100 * 2e-5, f"{label}: the adapters trained", f"max change {moved:.2e}")
    return ref


def default_init(checks, work, hf_dir, lora, dump):
    """PEFT's initialisation from the seed, the same at every world size."""
    runs = {}
    for strategy, world in (("no_shard", 1), ("full_shard", 3)):
        cfg, _ = job(work, hf_dir, lora, strategy, world)
        cfg["train"]["steps"] = 1
        cfg["optimizer"]["lr"] = 0.0  # the parameters stay as initialised
        out, ranks = harness.run(cfg, world)
        runs[world] = ({k: torch.from_numpy(v) for k, v in harness.load_params(out).items()}, ranks[0]["steps"][0])
    params, step0 = runs[1]
    b_zero = all(float(v.abs().max()) == 0 for k, v in params.items() if ".lora_B." in k)
    a_in_bound = all(0 < float(v.abs().max()) <= 1 / v.shape[1] ** 0.5 for k, v in params.items() if ".lora_A." in k)
    checks.check(b_zero and a_in_bound, "default init: lora_B zero, lora_A within 1/sqrt(in)")
    same = all(torch.equal(params[k], runs[3][0][k]) for k in params)
    checks.check(same, "default init: a function of the seed alone (N=1 equals N=3)")
    with torch.no_grad():
        loss = hf_loss(base_model(hf_dir), dump["batch.inputs"], dump["batch.targets"]).item()
    rel = abs(step0["loss"] - loss) / loss
    checks.check(rel < 1e-6, "default init: step 0's loss is the base model's (B = 0)", f"rel diff {rel:.2e}")


def checkpoints_and_export(checks, name, work, hf_dir, lora, adapters, ref, dump):
    lora = {**lora, "init_from": adapters}
    ckpt = os.path.join(work, "ckpt")
    cfg, _ = job(work, hf_dir, lora, "full_shard", 2)
    harness.run(cfg, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", "5", "--stop-after", "5"])
    step_dir = os.path.join(ckpt, "tiny", "step-00000005")
    shard = load_file(os.path.join(step_dir, "rank-00000.safetensors"))
    manifest = json.load(open(os.path.join(step_dir, "manifest.json")))
    only_adapters = all(k.split(".")[-2] == "lora" for k in shard) and manifest["lora"]["rank"] == lora["rank"]
    checks.check(only_adapters and manifest["lora"]["base_weights"] == f"hf_dir {hf_dir}",
                 f"{name}: a LoRA checkpoint holds adapters only and names its base", str(sorted(shard)[:2]))
    cfg, _ = job(work, hf_dir, lora, "shard_grad_op", 3, "replicated")
    out, ranks = harness.run(cfg, 3, extra_args=["--resume", step_dir])
    params = {k: torch.from_numpy(v) for k, v in harness.load_params(out).items()}
    diff = max_diff(params, ref)
    checks.check(ranks[0]["steps"][0]["step"] == 5 and diff < 2e-5,
                 f"{name}: saved at N=2 full_shard, resumed at N=3 shard_grad_op: adapters vs PEFT",
                 f"max abs diff {diff:.2e}")
    for label, keys, expected in (
            ("without [lora]", None, "a LoRA checkpoint (adapters only): the job needs its [lora] table"),
            ("with another rank", {**lora, "rank": lora["rank"] * 2}, "adapters of rank")):
        del_init = dict(keys) if keys else None
        if del_init:
            del_init.pop("init_from")  # (its adapter_config would contradict the rank first)
        cfg, _ = job(work, hf_dir, del_init, "full_shard", 1)
        try:
            harness.run(cfg, 1, extra_args=["--resume", step_dir])
            err = ""
        except harness.RunError as e:
            err = str(e)
        checks.check(expected in err, f"{name}: resume {label} is refused", err[-160:])

    # --format peft: PEFT loads it; the tensors are exactly its adapter keys.
    final = os.path.join(ckpt, "tiny", "step-00000010")
    cfg, _ = job(work, hf_dir, lora, "full_shard", 2)
    out, _ = harness.run(cfg, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", "10"])
    trained = {k: torch.from_numpy(v) for k, v in harness.load_params(out).items()}
    exported = os.path.join(work, "peft")
    r = subprocess.run([SHARDCTL, "ckpt", "export", final, "--format", "peft", "--out", exported],
                       capture_output=True, text=True)
    checks.check(r.returncode == 0, f"{name}: ckpt export --format peft", r.stderr.strip())
    model = PeftModel.from_pretrained(base_model(hf_dir), exported).eval()
    theirs = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    ours = load_file(os.path.join(exported, "adapter_model.safetensors"))
    same_keys = {k.replace(".default.", ".") for k in theirs} == set(ours)
    bitwise = all(torch.equal(theirs[peft_name(k)], v) for k, v in trained.items())
    checks.check(same_keys and bitwise, f"{name}: PeftModel.from_pretrained loads the export; adapters bitwise")
    with torch.no_grad():
        peft_logits = model(input_ids=dump["batch.inputs"]).logits
        # ... and the one-process PEFT model trained alongside gives the same logits.
        trained_peft = PeftModel.from_pretrained(base_model(hf_dir), adapters).eval()
        trained_peft.load_state_dict(ref)
        ref_logits = trained_peft(input_ids=dump["batch.inputs"]).logits
    e = float((peft_logits - ref_logits).abs().max() / ref_logits.abs().max())
    checks.check(e < 1e-5, f"{name}: the exported adapters give the one-process PEFT model's logits",
                 f"max rel error {e:.2e}")
    # --format hf --merge: the merged model computes what the PeftModel does.
    merged = os.path.join(work, "merged")
    r = subprocess.run([SHARDCTL, "ckpt", "export", final, "--format", "hf", "--merge", "--out", merged],
                       capture_output=True, text=True)
    checks.check(r.returncode == 0, f"{name}: ckpt export --format hf --merge", r.stderr.strip())
    m, info = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    with torch.no_grad():
        logits = m.eval()(input_ids=dump["batch.inputs"]).logits
    e = float((logits - peft_logits).abs().max() / peft_logits.abs().max())
    checks.check(not problems and e < 1e-5, f"{name}: the merged export has the PeftModel's logits",
                 f"max rel error {e:.2e} {problems or ''}")
    r = subprocess.run([SHARDCTL, "ckpt", "export", final, "--format", "hf", "--out", merged + "2"],
                       capture_output=True, text=True)
    checks.check(r.returncode == 1 and "--format hf --merge" in r.stderr, f"{name}: a plain hf export is refused",
                 r.stderr.strip())

    # Another base of the same shapes at the same path (a fine-tune, another
    # revision): its weights differ from those the adapters were trained on,
    # so merging onto it and resuming on it are refused, naming the base.
    weights = os.path.join(hf_dir, "model.safetensors")
    original = open(weights, "rb").read()
    other = {k: v + 0.01 for k, v in load_file(weights).items()}
    save_file(other, weights, metadata={"format": "pt"})
    try:
        r = subprocess.run([SHARDCTL, "ckpt", "export", final, "--format", "hf", "--merge", "--out", merged + "3"],
                           capture_output=True, text=True)
        checks.check(r.returncode == 1 and "is not the one these adapters were trained on" in r.stderr,
                     f"{name}: --merge onto another base at the same path is refused", r.stderr.strip())
        cfg, _ = job(work, hf_dir, lora, "full_shard", 1)
        try:
            harness.run(cfg, 1, extra_args=["--resume", final])
            err = ""
        except harness.RunError as e:
            err = str(e)
        checks.check("is not the one these adapters were trained on" in err,
                     f"{name}: resume on another base at the same path is refused", err[-200:])
    finally:
        open(weights, "wb").write(original)


def bad_inputs(checks, work, hf_dir, lora, adapters):
    root = harness.scratch_dir("shardline-peft-bad-")

    def refused(label, expected, adapter_fault=None, **keys):
        d = os.path.join(root, label.replace(" ", "_"))
        os.makedirs(d)
        init = adapters
        if adapter_fault:
            init = os.path.join(d, "adapters")
            shutil.copytree(adapters, init)
            adapter_fault(init)
        _, path = job(d, hf_dir, {**lora, "init_from": init, **keys})
        harness.refused_at_submit(checks, label, path, expected)

    def edit_config(**kv):
        def fault(d):
            p = os.path.join(d, "adapter_config.json")
            c = json.load(open(p))
            c.update(kv)
            json.dump(c, open(p, "w"))
        return fault

    def drop_tensor(d):
        p = os.path.join(d, "adapter_model.safetensors")
        t = load_file(p)
        t.pop(sorted(t)[0])
        save_file(t, p)

    refused("an unknown target module", '[lora] target_modules: "qkv_proj" is not a projection of family "llama"',
            target_modules=["qkv_proj"], init_from="")
    refused("dropout", "[lora] dropout = 0.1 is not supported", dropout=0.1, init_from="")
    refused("rank 0", "[lora] rank = 0 is out of range", rank=0, init_from="")
    refused("an unknown base", '[lora] base: unknown value "cpu"', base="cpu", init_from="")
    refused("a rank contradicting the adapters", f"[lora] rank = 3 contradicts {adapters}/adapter_config.json r = 4", rank=3)
    refused("DoRA adapters", "use_dora: set to true (not supported)", edit_config(use_dora=True))
    refused("rsLoRA adapters", "use_rslora: set to true (not supported)", edit_config(use_rslora=True))
    refused("a missing adapter tensor", "[lora] init_from", drop_tensor)
    refused("no adapter_config.json", "adapters: no adapter_config.json (not a PEFT adapter directory)",
            lambda d: os.remove(os.path.join(d, "adapter_config.json")))


def main():
    checks = harness.Checks()
    for name, (lora, _) in CASES.items():
        work = harness.scratch_dir(f"shardline-peft-{name}-")
        hf_dir = os.path.join(work, "base")
        source_model(name).float().save_pretrained(hf_dir)
        adapters = os.path.join(work, "adapters")
        make_adapters(name, hf_dir, lora, adapters)
        dump = batches(work, hf_dir)
        ref = equivalence(checks, name, work, hf_dir, lora, adapters, dump)
        if name == "llama3":
            default_init(checks, work, hf_dir, lora, dump)
            checkpoints_and_export(checks, name, work, hf_dir, lora, adapters, ref, dump)
            bad_inputs(checks, work, hf_dir, lora, adapters)
        elif name == "gpt2":
            checkpoints_and_export(checks, name, work, hf_dir, lora, adapters, ref, dump)
    checks.finish()


if __name__ == "__main__":
    main()
