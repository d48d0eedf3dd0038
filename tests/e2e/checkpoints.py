"""Checkpoints through the cluster: a job saving every 5 steps with
keep_latest = 2 leaves exactly its two newest committed checkpoints (each a
manifest plus one shard file per rank); `resume` at another world size and
strategy continues the loss curve, names the job it came from, and
`status --history` (and `--tensorboard`, read by TensorBoard's own reader)
runs across both; `ckpt save` on a running job commits a checkpoint;
resuming from a directory without a manifest is refused."""
import json
import os
import time

from cluster import Checks, Cluster, job_file, wait_for

CKPT = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\nkeep_latest = 2\n'


def check_tensorboard(c, cl, job, losses):
    """status --tensorboard DIR: TensorBoard's own reader finds every step's
    loss (simple_value is a float32: within its rounding, 2^-24 relative)."""
    from tensorboard.backend.event_processing import event_accumulator
    tb = os.path.join(cl.dir, "tb")
    rc, out, err = cl.ctl("status", job, "--tensorboard", tb)
    c.check(rc == 0 and len(out.splitlines()) == 1 and out.startswith(f"wrote {len(losses)} steps to "),
            "status --tensorboard prints what it wrote, one line (not the status again)", out.strip()[:200])
    acc = event_accumulator.EventAccumulator(tb)
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    got = {e.step: e.value for e in acc.Scalars("shardline/loss")} if "shardline/loss" in tags else {}
    c.check(rc == 0 and sorted(got) == sorted(losses) and
            all(abs(got[s] - l) <= 2 ** -24 * abs(l) for s, l in losses.items()),
            "status --tensorboard writes every step's loss, as TensorBoard reads it",
            f"{len(got)} of {len(losses)} steps; tags {tags} {err.strip()}")
    c.check({"shardline/lr", "shardline/grad_norm", "shardline/tokens_per_second"} <= set(tags),
            "and the lr, grad norm and tokens/s", str(tags))


def main():
    c = Checks()
    cl = Cluster()
    for h in ("host-a", "host-b", "host-c"):
        cl.add_worker(h)
    cl.wait_workers(3)

    rc, out, err = cl.ctl("--json", "submit", job_file(cl.dir, "saver", workers=2, steps=20, extra=CKPT, micro=2), "--follow",
                          timeout=120)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    job = lines[0]["job_id"]
    losses = {}
    for l in lines[1:]:
        if l.get("step"):
            losses[l["step"]] = l["loss"]
    c.check(rc == 0, "the saving job succeeded", err.strip())
    ckpts = cl.ctl_json("ckpt", "list", job)["checkpoints"]
    c.check([k["step"] for k in ckpts] == [15, 20], "keep_latest = 2 keeps the two newest", str(ckpts))
    root = os.path.join(cl.dir, "ckpt", job)
    on_disk = sorted(os.listdir(root)) if os.path.isdir(root) else []
    c.check(on_disk == ["history.jsonl", "step-00000015", "step-00000020"], "older checkpoints were removed from disk",
            str(on_disk))
    with open(os.path.join(root, "history.jsonl")) as f:
        history = [json.loads(line) for line in f]
    c.check([h["step"] for h in history] == list(range(1, 21)) and
            all(abs(h["loss"] - losses[h["step"]]) <= 1e-6 * abs(losses[h["step"]]) for h in history if h["step"] in losses),
            "rank 0 appends each step's record to history.jsonl beside the checkpoints", str(history[-1]))
    st = st_first = cl.ctl_json("status", job, "--history")
    c.check([h["step"] for h in st.get("history", [])] == list(range(1, 21)),
            "status --history carries every step of the run", f"{len(st.get('history', []))} records")
    files = sorted(os.listdir(ckpts[0]["path"]))
    c.check(files == ["manifest.json", "rank-00000.safetensors", "rank-00001.safetensors"],
            "a checkpoint is a manifest and one shard file per rank", str(files))
    modes = {p: os.stat(p).st_mode & 0o777 for p in [root, ckpts[0]["path"]] +
             [os.path.join(ckpts[0]["path"], f) for f in files]}
    c.check(all(m & 0o007 == 0 for m in modes.values()), "checkpoints are not world-readable",
            str({os.path.basename(p): oct(m) for p, m in modes.items()}))
    state = {p: os.stat(p).st_mode & 0o777 for p in (cl.state, os.path.join(cl.state, "coordinator.db"))}
    c.check(list(state.values()) == [0o700, 0o600], "the state directory is 0700 and its database 0600",
            str([oct(m) for m in state.values()]))

    rc, out, err = cl.ctl("--json", "resume", job, "--from", ckpts[0]["path"], "--workers", "3", "--strategy",
                          "shard_grad_op")
    c.check(rc == 0, "resume at 3 workers with shard_grad_op accepted", err.strip())
    resumed = json.loads(out)["job_id"]
    rc, out, err = cl.ctl("--json", "watch", resumed, timeout=120)
    snaps = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    steps = sorted({s["step"] for s in snaps if s["step"]})
    # It starts at the checkpoint's step 15 (the job's step from its start), never below.
    c.check(rc == 0 and steps[0] >= 15 and steps[-1] == 20, "the resumed job continues after step 15 and ends at 20",
            f"steps {steps[0]}..{steps[-1]}")
    final = cl.job(resumed)["loss"]
    rel = abs(final - losses[20]) / losses[20]
    c.check(rel < 1e-5, "its loss at step 20 matches the uninterrupted run", f"{final:.6f} vs {losses[20]:.6f}")
    # One job, one history: the lineage, and --history across it.
    st = cl.job(resumed)
    c.check((st["resumed_from"] or {}).get("job") == job and st["resumed_from"]["step"] == 15,
            "status names the job and step it resumed from", json.dumps(st["resumed_from"]))
    rc, out, err = cl.ctl("--json", "status", resumed, "--history")
    hist = [(h["step"], h["loss"]) for h in json.loads(out).get("history", [])] if rc == 0 else []
    first_run = {h["step"]: h["loss"] for h in st_first.get("history", [])}
    c.check([s for s, _ in hist] == list(range(1, 21)) and all(l == first_run.get(s) for s, l in hist if s <= 15),
            "status --history runs from step 1 to 20 across the resume, steps 1-15 those of the first job",
            f"steps {[s for s, _ in hist][:3]}..{[s for s, _ in hist][-3:]} {err.strip()}")
    rc, out, _ = cl.ctl("jobs")
    row = next((l.split() for l in out.splitlines() if l.startswith(resumed + " ")), [])
    c.check(rc == 0 and job in row, "jobs shows where a resumed job came from", " ".join(row))
    check_tensorboard(c, cl, resumed, dict(hist))

    # ckpt save on a running job.
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "long", workers=2, steps=1000000,
                                                     extra='\n[checkpoint]\ndir = "ckpt"\n'))
    long_job = json.loads(out)["job_id"]
    wait_for(lambda: cl.job(long_job)["step"] > 3, 60, "the long job to run")
    rc, out, err = cl.ctl("--json", "ckpt", "save", long_job)
    saved = json.loads(out) if rc == 0 else {}
    got = cl.ctl_json("ckpt", "list", long_job)["checkpoints"]  # at once: ckpt save waited for the commit
    c.check(rc == 0 and len(got) == 1 and got[0] == saved and os.path.exists(os.path.join(got[0]["path"], "manifest.json")),
            "ckpt save returns the committed checkpoint", f"{err.strip()} {got}")
    # Deleting: refused while running; after cancel it forgets the job and its checkpoints.
    rc, _, err = cl.ctl("delete", long_job)
    c.check(rc == 1 and "cancel it before deleting it" in err, "a running job cannot be deleted", err.strip())
    cl.ctl("cancel", long_job)
    # All three: host-c was idle throughout, so two idle workers can mean one rank still stopping
    # (delete then refuses, rightly: "rank 1 on host-b is still stopping; try again").
    cl.wait_workers(3, timeout=30)
    rc, out, err = cl.ctl("--json", "delete", long_job, "--checkpoints")
    c.check(rc == 0 and json.loads(out)["removed_checkpoints"] == 1 and not os.path.exists(got[0]["path"])
            and cl.ctl("status", long_job)[0] == 1, "delete --checkpoints forgets the job and removes its checkpoint",
            err.strip() or out.strip())

    # A save that cannot be written (its checkpoint root is a file, which
    # stops root too) fails the job promptly, naming the path: it is not
    # discovered at the end of a million steps.
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "unsaveable", workers=2, steps=1000000,
                                                     extra='\n[checkpoint]\ndir = "ckpt"\n'))
    doomed = json.loads(out)["job_id"]
    with open(os.path.join(cl.dir, "ckpt", doomed), "w") as f:
        f.write("not a directory\n")
    wait_for(lambda: cl.job(doomed)["step"] > 3, 60, "the unsaveable job to run")
    rc, _, err = cl.ctl("ckpt", "save", doomed, "--timeout", "30")
    c.check(rc == 1 and "ended FAILED before it committed the checkpoint" in err and "cannot create directory" in err,
            "ckpt save reports a save that fails, naming why", err.strip()[-200:])
    st = cl.job(doomed)
    c.check(st["state"] == "FAILED" and doomed in st["message"] and "cannot create directory" in st["message"],
            "a save that cannot be written fails the job at once, naming the path", st["message"][-160:])
    if st["state"] != "FAILED":
        cl.ctl("cancel", doomed)

    # Bad resumes.
    bare = os.path.join(cl.dir, "not-a-checkpoint")
    os.makedirs(bare)
    rc, _, err = cl.ctl("resume", job, "--from", bare)
    c.check(rc == 1 and "no manifest.json: not a committed checkpoint" in err and bare in err,
            "resume from a directory without a manifest refused", err.strip())
    # [checkpoint] at_end = false: a job that never saves (its last step neither).
    rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "nockpt", workers=1, steps=2,
                                                     extra="\n[checkpoint]\nat_end = false\n"))
    nockpt = json.loads(out)["job_id"]
    cl.ctl("watch", nockpt, timeout=60)
    rc, _, err = cl.ctl("resume", nockpt)
    c.check(rc == 1 and "has no committed checkpoint" in err, "resume of a job without checkpoints refused",
            err.strip())
    c.check(sorted(os.listdir(root)) == on_disk, "nothing was deleted by the refused resumes")
    fine_tune_from_hf_dir(c, cl)
    c.finish()


def fine_tune_from_hf_dir(c, cl):
    """A transformers directory named relative to the job file: the
    coordinator, the workers and a resume at another world size all find it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 max_position_embeddings=64)).save_pretrained(os.path.join(cl.dir, "qwen-tiny"))
    import numpy as np
    from harness import write_llmc
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 2000), ("val.bin", 600)):
        write_llmc(os.path.join(cl.dir, name), rng.integers(0, 64, n))
    path = os.path.join(cl.dir, "finetune.toml")
    with open(path, "w") as f:
        f.write('[job]\nname = "finetune"\nworkers = 2\n[model]\nhf_dir = "qwen-tiny"\nblock_size = 16\n'
                '[data]\nformat = "llmc"\npath = "train.bin"\nval_path = "val.bin"\n'
                '[train]\nsteps = 10\nbatch_size = 12\nmicro_batch_size = 2\neval_interval = 3\neval_batches = 2\n'
                '[checkpoint]\ndir = "ckpt"\ninterval = 5\n')
    rc, out, err = cl.ctl("--json", "submit", path, "--follow", timeout=120)
    c.check(rc == 0, "a job with a relative [model] hf_dir succeeds through the cluster", err.strip())
    job = json.loads(out.splitlines()[0])["job_id"]
    st = cl.job(job)
    c.check(st["val_loss"] is not None and st["val_step"] == 10 and 3 < st["val_loss"] < 6,
            "shardctl status shows the validation loss after the last step", f"{st['val_loss']} at {st['val_step']}")
    first = cl.ctl_json("ckpt", "list", job)["checkpoints"][0]["path"]
    rc, out, err = cl.ctl("--json", "resume", job, "--from", first, "--workers", "3", "--follow", timeout=120)
    c.check(rc == 0, "its resume at 3 workers succeeds", err.strip())
    lora_through_the_cluster(c, cl, path)


def lora_through_the_cluster(c, cl, finetune_job):
    """The same fine-tune with LoRA: the coordinator commits adapter-only
    checkpoints, a resume at another world size continues them, and the
    adapters export to a directory PEFT loads onto the base."""
    path = os.path.join(cl.dir, "lora.toml")
    with open(finetune_job) as src, open(path, "w") as f:
        f.write(src.read().replace('name = "finetune"', 'name = "lora"') +
                '[lora]\nrank = 4\nalpha = 8\ntarget_modules = "all-linear"\nbase = "replicated"\n')
    rc, out, err = cl.ctl("--json", "submit", path, "--follow", timeout=120)
    c.check(rc == 0, "a LoRA job succeeds through the cluster", err.strip())
    job = json.loads(out.splitlines()[0])["job_id"]
    ckpts = [x["path"] for x in cl.ctl_json("ckpt", "list", job)["checkpoints"]]
    manifest = json.load(open(os.path.join(ckpts[0], "manifest.json")))
    c.check(manifest.get("lora", {}).get("rank") == 4 and all(u["unit"].endswith(".lora") for u in manifest["ownership"]),
            "the coordinator's manifest records the adapters and their ownership", str(manifest.get("lora")))
    rc, out, err = cl.ctl("--json", "resume", job, "--from", ckpts[0], "--workers", "3", "--follow", timeout=120)
    c.check(rc == 0, "the LoRA job resumes at 3 workers", err.strip())
    resumed = json.loads(out.splitlines()[0])["job_id"]
    last = cl.ctl_json("ckpt", "list", resumed)["checkpoints"][-1]["path"]
    exported = os.path.join(cl.dir, "lora-adapters")
    rc, _, err = cl.ctl("ckpt", "export", last, "--format", "peft", "--out", exported)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    ok = rc == 0
    if ok:
        base = AutoModelForCausalLM.from_pretrained(os.path.join(cl.dir, "qwen-tiny"), dtype=torch.float32)
        model = PeftModel.from_pretrained(base, exported)
        ok = any("lora_B" in n and float(p.abs().max()) > 0 for n, p in model.named_parameters())
    c.check(ok, "its adapters export to a directory PeftModel.from_pretrained loads (trained: lora_B is not zero)",
            err.strip())


if __name__ == "__main__":
    main()
