"""Oracle: a PyTorch Distributed Checkpoint (DCP) of FSDP2 continues in
Shardline (`shardctl ckpt import`, issue 28).

1. PyTorch FSDP2 (Gloo, CPU, two processes: fsdp2_dcp.py) trains the tiny
   llama3 of harness.LLAMA_MODELS (transformers' LlamaForCausalLM) for 10
   steps on the engine's batches, saving {"model", "optim"} of get_state_dict
   with dcp.save after step 5.
2. `shardctl ckpt import` turns that DCP directory into a Shardline
   checkpoint; its weights, exported with `ckpt export --format hf`, are
   FSDP2's at step 5 bitwise (a copy of fp32 values).
3. shardline-train resumes it at N=3 under full_shard for steps 5..9: its
   parameters and losses equal FSDP2's own continuation at N=2. The two runs
   differ only in summation order (2 ranks against 3, another reduction tree),
   so the bound is harness.reorder_param_tol over the 5 steps run apart; the
   losses, computed from parameters that close, agree to 1e-5 relative (as in
   llama_oracle.py).
   The same through the service: `shardctl submit --resume-from` on a
   coordinator with three workers, whose step history holds those losses.
4. The same checkpoint in torchtitan's names and interleaved RoPE rows
   (fsdp2_dcp.py titan, one process: whole tensors, one chunk each) imports to
   the same shard file, byte for byte: weights and both moments; its
   train_state.step (an int32 tensor) is the data position.
5. Export (`ckpt export --format dcp`): Shardline trains 10 steps at N=3,
   saving after 5; FSDP2 at N=2 loads the export of that checkpoint as a user
   does (get_state_dict, dcp.load, set_state_dict) and runs steps 5..9, equal
   to Shardline's own continuation within the same bound; one process with no
   process group dcp.loads the model's weights from it, bitwise the
   checkpoint's.
6. Bad input is refused in one line naming the file or tensor, and nothing is
   committed: a .metadata that names a foreign global, a missing and a
   truncated .distcp, a job whose shapes disagree, a checkpoint of a deeper
   model (a tensor the job lacks), and an int32 tensor.
"""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys

from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
import harness  # noqa: E402
from cluster import Cluster  # noqa: E402
from llama_oracle import llama_config  # noqa: E402

NAME, STEPS, SAVE, WORLD_FSDP, WORLD_SL = "llama3", 10, 5, 2, 3
SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp2_dcp.py")


def peer_job(cfg, out):
    job = os.path.join(out, "job.json")
    with open(job, "w") as f:
        json.dump({**cfg, "oracle_model": NAME}, f)
    return job


def fsdp2(mode, cfg, dump, out, *args):
    """fsdp2_dcp.py MODE at WORLD_FSDP ranks; its losses."""
    os.makedirs(out, exist_ok=True)
    job = peer_job(cfg, out)
    port = harness.free_port()
    procs = [subprocess.Popen([sys.executable, PEER, mode, str(r), str(WORLD_FSDP), str(port), job, dump, out,
                               *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(WORLD_FSDP)]
    harness.wait_ranks(procs, 300, what="FSDP2", done=lambda r: os.path.exists(os.path.join(out, f"rank-{r}.done")))
    with open(os.path.join(out, "losses.json")) as f:
        return json.load(f)


def shardctl(*args):
    return subprocess.run([SHARDCTL, *args], capture_output=True, text=True, timeout=120)


def imported(dcp_dir, job, root):
    r = shardctl("--json", "ckpt", "import", dcp_dir, "--job", job, "--out", root)
    if r.returncode != 0:
        raise harness.RunError(f"ckpt import {dcp_dir}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def exported_weights(step_dir, scratch, name):
    out = os.path.join(scratch, name)
    r = shardctl("ckpt", "export", step_dir, "--format", "hf", "--out", out)
    if r.returncode != 0:
        raise harness.RunError(f"ckpt export {step_dir}: {r.stderr.strip()}")
    return load_file(os.path.join(out, "model.safetensors"))


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_refused(checks, label, dcp_dir, job, scratch, expected):
    root = os.path.join(scratch, "refused-" + label.replace(" ", "-"))
    r = shardctl("ckpt", "import", dcp_dir, "--job", job, "--out", root)
    err = r.stderr.strip()
    committed = os.path.isdir(root) and any(os.path.exists(os.path.join(root, d, "manifest.json"))
                                            for d in os.listdir(root))
    checks.check(r.returncode != 0 and err.count("\n") == 0 and all(e in err for e in expected) and not committed,
                 f"refused: {label}", err)


def linked_outputs(checks, dcp_dir, job, scratch):
    """--out, or its step folder, a symlink: refused before anything is
    written, and nothing lands where the link points (nor a staging folder)."""
    target = os.path.join(scratch, "link-target")
    os.makedirs(target)
    link = os.path.join(scratch, "out-link")
    os.symlink(target, link)
    r = shardctl("ckpt", "import", dcp_dir, "--job", job, "--out", link)
    checks.check(r.returncode == 1 and "symlink" in r.stderr and os.listdir(target) == [],
                 "import --out a symlink: refused, nothing written through it", r.stderr.strip())
    root = os.path.join(scratch, "step-link-root")
    os.makedirs(root)
    os.symlink(target, os.path.join(root, f"step-{SAVE:08d}"))
    r = shardctl("ckpt", "import", dcp_dir, "--job", job, "--out", root)
    checks.check(r.returncode == 1 and "symlink" in r.stderr and os.listdir(target) == []
                 and sorted(os.listdir(root)) == [f"step-{SAVE:08d}"],
                 "import into ROOT whose step folder is a symlink: refused, nothing in its target, no staging left",
                 f"{r.stderr.strip()} {sorted(os.listdir(root))} {os.listdir(target)}")


def step_folder_taken(checks, dcp_dir, job, scratch):
    """The step's folder already there without a manifest (another import of
    that step under way, or one that was stopped): refused naming it, and
    what is in it left alone; two imports of one step never mix."""
    root = os.path.join(scratch, "taken-root")
    step = os.path.join(root, f"step-{SAVE:08d}")
    os.makedirs(step)
    with open(os.path.join(step, "rank-00000.safetensors"), "wb") as f:
        f.write(b"the other import's shard")
    r = shardctl("ckpt", "import", dcp_dir, "--job", job, "--out", root)
    with open(os.path.join(step, "rank-00000.safetensors"), "rb") as f:
        kept = f.read() == b"the other import's shard"
    checks.check(r.returncode == 1 and "exists without a manifest" in r.stderr and r.stderr.count("\n") == 1
                 and kept and sorted(os.listdir(root)) == [f"step-{SAVE:08d}"] and os.listdir(step) ==
                 ["rank-00000.safetensors"],
                 "import into a step folder another import holds: refused naming it, its shard untouched",
                 f"{r.stderr.strip()} {sorted(os.listdir(root))} {os.listdir(step)}")


def main():
    checks = harness.Checks()
    scratch = harness.scratch_dir("shardline-dcp-")
    cfg = llama_config(NAME, "full_shard", WORLD_SL)
    cfg["train"]["steps"] = STEPS
    job = os.path.join(scratch, "job.toml")
    harness.write_toml(cfg, job)
    dump = os.path.join(scratch, "dump.safetensors")
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", dump], check=True, timeout=120)

    dcp_dir = os.path.join(scratch, "fsdp2-dcp")
    fsdp_losses = fsdp2("train", cfg, dump, scratch, STEPS, SAVE, dcp_dir)
    fsdp_at_save = load_file(os.path.join(scratch, f"params-{SAVE}.safetensors"))
    fsdp_final = load_file(os.path.join(scratch, "params.safetensors"))

    report = imported(dcp_dir, job, os.path.join(scratch, "imported"))
    step_dir = report["step_dir"]
    checks.check(report["step"] == SAVE and report["names"] == "engine",
                 "import finds AdamW's step and transformers' names", json.dumps(report))
    weights = exported_weights(step_dir, scratch, "export")
    same = sorted(weights) == sorted(fsdp_at_save) and all((weights[k] == fsdp_at_save[k]).all() for k in weights)
    checks.check(same, f"imported weights are FSDP2's at step {SAVE}, bitwise", f"{len(weights)} tensors")

    run_out, ranks = harness.run(cfg, WORLD_SL, extra_args=["--resume", step_dir])
    params = load_file(os.path.join(run_out, "params.safetensors"))
    diff = max(float((params[k] - fsdp_final[k]).abs().max()) for k in fsdp_final)
    tol = harness.reorder_param_tol(cfg["optimizer"]["lr"], STEPS - SAVE)
    checks.check(sorted(params) == sorted(fsdp_final) and diff <= tol,
                 f"Shardline N={WORLD_SL} full_shard from the import equals FSDP2's N={WORLD_FSDP} continuation: params",
                 f"max abs diff {diff:.2e} (tolerance {tol:.1e})")
    losses = [s["loss"] for s in ranks[0]["steps"]]
    rel = max(abs(a - b) / b for a, b in zip(losses, fsdp_losses[SAVE:]))
    checks.check(len(losses) == STEPS - SAVE and ranks[0]["steps"][0]["step"] == SAVE and rel < 1e-5,
                 "... and losses of steps 5..9", f"max rel diff {rel:.2e}")

    cl = Cluster()
    for h in ("host-a", "host-b", "host-c"):
        cl.add_worker(h)
    cl.wait_workers(3)
    rc, out, err = cl.ctl("--json", "submit", job, "--workers", str(WORLD_SL), "--resume-from", step_dir, "--follow",
                          timeout=180)
    job_id = json.loads(out.splitlines()[0])["job_id"] if rc == 0 else None
    history = cl.ctl_json("status", job_id, "--history").get("history", []) if job_id else []
    got = {h["step"]: h["loss"] for h in history}
    want = {SAVE + 1 + i: l for i, l in enumerate(fsdp_losses[SAVE:])}
    checks.check(rc == 0 and sorted(got) == sorted(want) and
                 all(abs(got[k] - want[k]) / want[k] < 1e-5 for k in want),
                 "submit --resume-from the import: the job on 3 workers continues FSDP2's losses",
                 f"{err.strip()} steps {sorted(got)}")

    m = cfg["model"]
    titan_dir = os.path.join(scratch, "titan-dcp")
    subprocess.run([sys.executable, PEER, "titan", dcp_dir, titan_dir, str(m["n_head"]), str(m["n_kv_head"]),
                    str(SAVE + 2)], check=True, timeout=120, capture_output=True)
    titan = imported(titan_dir, job, os.path.join(scratch, "imported-titan"))
    checks.check(titan["names"] == "torchtitan" and titan["step"] == SAVE, "torchtitan's names are recognised",
                 json.dumps(titan))
    with open(os.path.join(titan["step_dir"], "manifest.json")) as f:
        data_step = json.load(f)["data_step"]
    checks.check(titan["data_step_from"] == "train_state.step" and data_step == SAVE + 2 and
                 report["data_step"] == SAVE and report["data_step_from"] == "the step",
                 "the data position is torchtitan's train_state.step where present, else AdamW's step",
                 f"manifest data_step {data_step}; FSDP2's import: {report['data_step_from']}")
    ours, theirs = (os.path.join(r["step_dir"], "rank-00000.safetensors") for r in (report, titan))
    checks.check(sha256(ours) == sha256(theirs), "torchtitan's checkpoint imports to the same shard file, byte for "
                 "byte (weights, exp_avg, exp_avg_sq; wq/wk permuted back)")

    # Export: Shardline's checkpoint of step 5 continued by FSDP2.
    ckpt = os.path.join(scratch, "shardline-ckpt")
    sl_out, sl_ranks = harness.run(cfg, WORLD_SL, extra_args=["--ckpt-dir", ckpt, "--save-at", str(SAVE)])
    sl_params = load_file(os.path.join(sl_out, "params.safetensors"))
    sl_step_dir = os.path.join(ckpt, cfg["job"]["name"], "step-%08d" % SAVE)
    exported = os.path.join(scratch, "exported-dcp")
    r = shardctl("ckpt", "export", sl_step_dir, "--format", "dcp", "--job", job, "--out", exported)
    checks.check(r.returncode == 0, "ckpt export --format dcp", (r.stdout + r.stderr).strip())
    resumed = os.path.join(scratch, "fsdp2-resumed")
    resumed_losses = fsdp2("resume", cfg, dump, resumed, SAVE, STEPS, exported)
    theirs = load_file(os.path.join(resumed, "params.safetensors"))
    diff = max(float((theirs[k] - sl_params[k]).abs().max()) for k in sl_params)
    checks.check(sorted(theirs) == sorted(sl_params) and diff <= tol,
                 f"FSDP2 N={WORLD_FSDP} from the export equals Shardline's N={WORLD_SL} continuation: params",
                 f"max abs diff {diff:.2e} (tolerance {tol:.1e})")
    sl_losses = [s["loss"] for s in sl_ranks[0]["steps"]][SAVE:]
    rel = max(abs(a - b) / b for a, b in zip(resumed_losses, sl_losses))
    checks.check(len(resumed_losses) == STEPS - SAVE and rel < 1e-5, "... and losses of steps 5..9",
                 f"max rel diff {rel:.2e}")
    one = os.path.join(scratch, "load1.safetensors")
    subprocess.run([sys.executable, PEER, "load1", exported, peer_job(cfg, scratch), one], check=True, timeout=120,
                   capture_output=True)
    loaded, want = load_file(one), exported_weights(sl_step_dir, scratch, "export-step5")
    same = sorted(loaded) == sorted(want) and all((loaded[k] == want[k]).all() for k in want)
    checks.check(same, "one process dcp.loads the export's weights bitwise", f"{len(loaded)} tensors")

    # Bad input.
    bad = os.path.join(scratch, "bad-global")
    shutil.copytree(dcp_dir, bad)
    with open(os.path.join(bad, ".metadata"), "wb") as f:
        f.write(pickle.dumps(os.system, protocol=2))
    check_refused(checks, "a foreign global", bad, job, scratch, [".metadata", "refused global", "system"])
    missing = os.path.join(scratch, "bad-missing")
    shutil.copytree(dcp_dir, missing)
    os.remove(os.path.join(missing, "__1_0.distcp"))
    check_refused(checks, "a missing .distcp", missing, job, scratch, ["__1_0.distcp"])
    short = os.path.join(scratch, "bad-short")
    shutil.copytree(dcp_dir, short)
    path = os.path.join(short, "__0_0.distcp")
    os.truncate(path, os.path.getsize(path) // 2)
    check_refused(checks, "a truncated .distcp", short, job, scratch, ["__0_0.distcp"])
    for label, section, key, value, expected in (
            ("a shape the job disagrees with", "model", "intermediate_size", 40, ["gate_proj.weight", "has shape"]),
            ("a tensor the job's model lacks", "model", "n_layer", 1, ["layers.1.", "a tensor the job's model lacks"])):
        other = json.loads(json.dumps(cfg))
        other[section][key] = value
        other_job = os.path.join(scratch, f"job-{key}.toml")
        harness.write_toml(other, other_job)
        check_refused(checks, label, dcp_dir, other_job, scratch, [".metadata"] + expected)
    retyped = os.path.join(scratch, "bad-dtype")
    subprocess.run([sys.executable, PEER, "retype", dcp_dir, retyped, "model.model.norm.weight", "int32"],
                   check=True, timeout=120, capture_output=True)
    check_refused(checks, "an int32 tensor", retyped, job, scratch, ["model.model.norm.weight", "int32"])
    # Values no job could train from: committed nowhere, refused naming the unit.
    flat = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(PEER)!r}); "
                           f"import fsdp2_dcp; print(*fsdp2_dcp.load_flat({dcp_dir!r}))"],
                          capture_output=True, text=True, timeout=120).stdout.split()
    moment = next((k for k in flat if k.endswith("exp_avg_sq") and "norm" in k), "")
    weight = next((k for k in flat if k.endswith("norm.weight") and k.startswith("model.")), "")
    for fqn, value, label in ((weight, "nan", "a NaN weight"), (moment, "-1", "a negative exp_avg_sq")):
        poisoned = os.path.join(scratch, "poisoned-" + label.split()[-2].lower())
        subprocess.run([sys.executable, PEER, "poison", dcp_dir, poisoned, fqn, value], check=True, timeout=120,
                       capture_output=True)
        check_refused(checks, label, poisoned, job, scratch, ["not a checkpoint to train from"])
    linked_outputs(checks, dcp_dir, job, scratch)
    step_folder_taken(checks, dcp_dir, job, scratch)
    checks.remove_unless_failed(scratch)
    checks.finish()


if __name__ == "__main__":
    main()
