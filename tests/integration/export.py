"""Export and init_from. Train 8 steps on real text (this repository's
README, read as bytes) at N=2 with full_shard, saving at step 5; export that
checkpoint with `shardctl ckpt export` (no coordinator). The file loads in
Python with safetensors, has both tied names, and a nanoGPT-style model built
from it gives the loss the engine reported for step 5 on the same batch. A job
started from the file ([model] init_from, either tied name) reports that model's
loss at its first step. An hf export creates missing parents, refuses a folder
with files unless --overwrite, and then leaves only its own weights beside the
user's other files. Exporting to an unwritable path fails cleanly."""
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import harness

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from nanogpt import GPT  # noqa: E402

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
CORPUS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"))


def batch(step, B, T):
    data = open(CORPUS, "rb").read()
    n = (len(data) - 1) // T
    xs, ys = [], []
    for j in range(B):
        i = (step * B + j) % n
        xs.append(list(data[i * T:i * T + T]))
        ys.append(list(data[i * T + 1:i * T + T + 1]))
    return torch.tensor(xs), torch.tensor(ys)


def loss_of(state, cfg, step):
    m = cfg["model"]
    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["vocab_size"], m["block_size"])
    model.load_state_dict(state, strict=True)
    x, y = batch(step, cfg["train"]["batch_size"], m["block_size"])
    with torch.no_grad():
        logits, _ = model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item()


def main():
    checks = harness.Checks()
    torch.set_num_threads(1)
    cfg = harness.config("full_shard", 2, train__steps=8, model__vocab_size=256, data__format="text",
                         data__path=CORPUS)
    ckpt = harness.scratch_dir("shardline-export-")
    _, ranks = harness.run(cfg, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", "5"])
    reported = ranks[0]["steps"][5]["loss"]  # step index 5 runs on the parameters after 5 steps
    step_dir = os.path.join(ckpt, "tiny", "step-00000005")
    out = os.path.join(ckpt, "model.safetensors")
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--out", out], capture_output=True, text=True)
    checks.check(r.returncode == 0 and os.path.exists(out), "ckpt export writes the file", r.stderr.strip())
    state = load_file(out)
    checks.check("transformer.wte.weight" in state and "lm_head.weight" in state and
                 torch.equal(state["transformer.wte.weight"], state["lm_head.weight"]),
                 "both tied names are present and equal")
    ours = loss_of(state, cfg, 5)
    checks.check(abs(ours - reported) / reported < 1e-5, "PyTorch's loss from the export matches the engine's",
                 f"{ours:.6f} vs {reported:.6f}")

    # --out is checked before the first step: under a file, refused at once
    # naming it, with no step run (it trained every step, then failed).
    blocker = os.path.join(ckpt, "a-file")
    open(blocker, "w").close()
    job = os.path.join(ckpt, "out-check.toml")
    harness.write_toml(harness.config("no_shard", 1, train__steps=2), job)
    r = subprocess.run([harness.TRAIN, "--config", job, "--out", os.path.join(blocker, "out")], capture_output=True,
                       text=True, timeout=60)
    c_err = r.stderr.strip()
    checks.check(r.returncode != 0 and r.stdout == "" and "--out" in c_err and blocker in c_err and
                 len(c_err.splitlines()) == 1, "shardline-train --out that cannot be written: refused before a step",
                 c_err)

    # init_from, with wte under either of its tied names.
    only_head = {k: v for k, v in state.items() if k != "transformer.wte.weight"}
    alt = os.path.join(ckpt, "lm_head_only.safetensors")
    save_file(only_head, alt)
    expected = loss_of(state, cfg, 0)
    for name, path in (("wte", out), ("lm_head", alt)):
        c2 = harness.config("no_shard", 1, train__steps=2, model__vocab_size=256, data__format="text",
                            data__path=CORPUS, model__init_from=path)
        _, r2 = harness.run(c2, 1)
        first = r2[0]["steps"][0]["loss"]
        checks.check(abs(first - expected) / expected < 1e-5, f"init_from a file naming the tied weight {name}",
                     f"{first:.6f} vs {expected:.6f}")
    bad = harness.config("no_shard", 1, train__steps=1, model__init_from=out)  # vocab 64: another model
    try:
        harness.run(bad, 1)
        checks.check(False, "init_from of another model's file refused")
    except harness.RunError as e:
        checks.check("has shape [256,32], the model needs [64,32]" in str(e), "init_from of another model refused",
                     str(e)[-110:])

    # An export into a folder an earlier export filled: refused, or with
    # --overwrite it leaves only its own weights (a stale model.safetensors
    # beside a new sharded index is what from_pretrained would load).
    hf = os.path.join(ckpt, "exports", "nested", "hf")  # parents are created
    export = lambda *a: subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--out", hf, *a],
                                       capture_output=True, text=True)
    r = export()
    checks.check(r.returncode == 0 and sorted(os.listdir(hf)) == ["config.json", "model.safetensors"],
                 "hf export into a folder whose parents are missing", r.stderr.strip())
    one_file = load_file(os.path.join(hf, "model.safetensors"))
    with open(os.path.join(hf, "NOTES.md"), "w") as f:
        f.write("the user's own file\n")
    before = sorted(os.listdir(hf))
    r = export("--max-shard-size", "20KB")
    checks.check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and f"{hf}: not empty" in r.stderr
                 and "--overwrite" in r.stderr, "an export into a folder with files is refused", r.stderr.strip())
    checks.check(sorted(os.listdir(hf)) == before, "the refused export changed nothing")
    r = export("--max-shard-size", "20KB", "--overwrite")
    files = sorted(os.listdir(hf))
    shards = [f for f in files if f.startswith("model-")]
    checks.check(r.returncode == 0 and "model.safetensors" not in files and "NOTES.md" in files and
                 "model.safetensors.index.json" in files and len(shards) > 1 and
                 len(files) == len(shards) + 3, "--overwrite leaves the new export's files and the user's only",
                 f"rc {r.returncode} {files} {r.stderr.strip()}")
    # --overwrite removes only this export's own files, and decides every
    # refusal before it removes anything: beside the export, prepare_data's
    # token shards, a DCP checkpoint, another tool's weights and a folder
    # named like a weight file.
    planted = {"data_train_000000.bin": b"tokens", "data_train_000000.mask": b"mask", ".metadata": b"dcp",
               "__0_0.distcp": b"dcp", "optimizer.pt": b"adam", "run.ckpt": b"lightning"}
    mixed = os.path.join(ckpt, "exports", "mixed")
    os.makedirs(mixed)
    for name, data in planted.items():
        with open(os.path.join(mixed, name), "wb") as f:
            f.write(data)
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--out", mixed, "--overwrite"],
                       capture_output=True, text=True)
    kept = {n: open(os.path.join(mixed, n), "rb").read() for n in planted if os.path.exists(os.path.join(mixed, n))}
    checks.check(r.returncode == 0 and kept == planted and "model.safetensors" in os.listdir(mixed),
                 "--overwrite beside token shards, a DCP checkpoint and optimizer files removes none of them",
                 f"rc {r.returncode} {r.stderr.strip()} kept {sorted(kept)}")
    os.makedirs(os.path.join(mixed, "model-00001-of-00002.safetensors"))
    with open(os.path.join(mixed, "pytorch_model.bin"), "wb") as f:
        f.write(b"another tool's weights")
    before = sorted(os.listdir(mixed))
    for planted_name in ("model-00001-of-00002.safetensors", "pytorch_model.bin"):  # the order they are listed
        r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "hf", "--out", mixed, "--overwrite",
                            "--max-shard-size", "20KB"], capture_output=True, text=True)
        checks.check(r.returncode == 1 and planted_name in r.stderr and len(r.stderr.strip().splitlines()) == 1
                     and sorted(os.listdir(mixed)) == before,
                     f"--overwrite with {planted_name} there: refused before anything is removed", r.stderr.strip())
        path = os.path.join(mixed, planted_name)
        os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
        before = sorted(os.listdir(mixed))

    sharded = {}
    for f in shards:
        sharded.update(load_file(os.path.join(hf, f)))
    checks.check(sharded.keys() == one_file.keys() and all(torch.equal(sharded[k], one_file[k]) for k in sharded),
                 "the sharded export holds the same weights as the one-file export")

    before = sorted(os.listdir(step_dir))
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--out", "/proc/forbidden/model.safetensors"],
                       capture_output=True, text=True)
    checks.check(r.returncode == 1 and "/proc/forbidden/model.safetensors" in r.stderr and
                 len(r.stderr.strip().splitlines()) == 1, "export to an unwritable path refused", r.stderr.strip())
    checks.check(sorted(os.listdir(step_dir)) == before, "nothing was deleted")
    checks.finish()


if __name__ == "__main__":
    main()
