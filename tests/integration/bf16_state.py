"""Optimizer state in bf16: [optimizer] master_dtype = moments_dtype = "bf16"
on bf16 parameters with bf16 reduction, what torch.optim.AdamW holds for a
model loaded in bfloat16 (no fp32 master, bf16 moments).

1. One process against PyTorch: the nanoGPT reference in bfloat16
   (model.to(torch.bfloat16), its loss in fp32 as the engine's head computes
   it, clip_grad_norm_, torch.optim.AdamW(foreach=False), the same schedule)
   on the engine's batches; ten steps.
2. Every strategy at N = 2, 3, 4 (and hybrid_shard with its optimizer across
   the replicas) against the engine's one process.
3. Bytes by kind: no master, moments of 2 bytes an element (formulas.
   state_bytes), 8 bytes a parameter under no_shard where fp32 state holds 16.
4. Checkpoints keep the dtype (BF16 in every rank file) and resume: at the
   same world size and strategy bitwise, at another within the tolerance.
5. DCP: `ckpt export --format dcp` of that checkpoint loads into a bfloat16
   nanoGPT and torch.optim.AdamW as a user loads it (get_state_dict,
   dcp.load, set_state_dict): stored in bfloat16, its weights bitwise the
   checkpoint's, each parameter's moments bf16 and bitwise the checkpoint's;
   `ckpt import` of that export resumes bitwise as the checkpoint itself did.
6. Bad input: bf16 state on fp32 parameters, and moments and master of
   different dtypes, refused naming the key.

Tolerance. Without a master, each update is rounded into the bf16 weight
itself: two runs whose gradients differ by rounding (another kernel, another
split of the batch; O(u) relative, u = 2^-8) can round a weight's update to
neighbouring bf16 values, one ulp apart, at any step, and stay apart from then
on. A bf16 weight's ulp is at most 2^-7 |w|, so S steps can part a weight by
S * 2^-7 |w| through rounding alone. Adam's normalised step also turns
gradient noise into an update of up to ~lr of either sign where the true
gradient is near zero, 2 * lr a step at worst; as in bf16.py, a tenth of that,
0.2 * lr * S, still separates any real error (a wrong reduction or a stale
shard moves every element by ~lr every step). Each element is held to
S * (2^-7 |w_ref| + 0.2 * lr); the key third of c_attn.bias (true gradient
exactly zero: harness.param_diffs) to S * (2^-7 |w_ref| + 2 * lr). Losses: the
fp32 mean over every token of bf16 logits, within u / 4 relative, as bf16.py
argues.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import load_file

import formulas
import harness

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from nanogpt import GPT, fp32_loss, model_from, train_reference  # noqa: E402

SHARDCTL = os.path.join(harness.BUILD, "client", "shardctl")

torch.set_num_threads(1)

STEPS = 10
LR = harness.TINY["optimizer"]["lr"]
BF16_STATE = {"precision__param_dtype": "bf16", "precision__reduce_dtype": "bf16",
              "optimizer__master_dtype": "bf16", "optimizer__moments_dtype": "bf16"}
LOSS_TOL = 2 ** -8 / 4


def within(got, want, steps, checks, name):
    """Every element within steps * (2^-7 |want| + 0.2 lr) (the key bias
    third within steps * (2^-7 |want| + 2 lr)); reports the worst ratio."""
    worst, where = 0.0, ""
    for k, w in want.items():
        w = np.asarray(w, dtype=np.float64)
        d = np.abs(np.asarray(got[k], dtype=np.float64) - w)
        lr_share = np.full(w.shape, 0.2 * LR)
        if k.endswith("attn.c_attn.bias"):
            C = w.shape[0] // 3  # [q | k | v]
            lr_share[C:2 * C] = 2 * LR
        ratio = float(np.max(d / (steps * (2.0 ** -7 * np.abs(w) + lr_share))))
        if ratio > worst:
            worst, where = ratio, k
    checks.check(worst <= 1.0, f"{name} params", f"worst element at {worst:.2f} of its tolerance ({where})")


def losses_within(got, want, checks, name):
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    checks.check(rel <= LOSS_TOL, f"{name} losses", f"max rel diff {rel:.3e} (tol {LOSS_TOL:.1e})")


def against_torch(checks):
    cfg = harness.config("no_shard", 1, **BF16_STATE)
    dump = harness.step0_dump(cfg, "shardline-bf16-state-")
    model = model_from(dump, cfg["model"]).to(torch.bfloat16)
    ref, torch_losses = train_reference(dump, cfg, model=model, loss_of=fp32_loss)
    ref = {k: v.float().numpy() for k, v in ref.items() if k != "lm_head.weight"}
    run_out, ranks = harness.run(cfg, 1)
    within(harness.load_params(run_out), ref, STEPS, checks, "N=1 vs torch.optim.AdamW on bf16 parameters")
    losses_within([s["loss"] for s in ranks[0]["steps"]], torch_losses, checks,
                  "N=1 vs torch.optim.AdamW on bf16 parameters")


def strategies(checks, ref_params, ref_losses):
    pieces = {"parallelism__shard_optimizer_across_replicas": True}
    runs = [(s, w, {}) for s in harness.STRATEGIES for w in (2, 3, 4)] + [("hybrid_shard", 4, pieces)]
    for strategy, world, kw in runs:
        if strategy.startswith("hybrid") and world == 3:
            continue  # (no grouping of 3 with replicas)
        cfg = harness.config(strategy, world, micro_batches=1 if world == 3 else 2, **BF16_STATE, **kw)
        out, ranks = harness.run(cfg, world)
        name = f"{strategy}{' (optimizer across replicas)' if kw else ''} N={world}"
        within(harness.load_params(out), ref_params, STEPS, checks, name)
        losses_within([s["loss"] for s in ranks[0]["steps"]], ref_losses, checks, name)
        expected = formulas.state_bytes(cfg, world)
        if not kw:
            got = {k: ranks[0]["memory"][k] for k in expected}
            checks.check(got == expected, f"{name}: bytes by kind", f"{got}" + ("" if got == expected
                                                                                 else f" expected {expected}"))


def checkpoints(checks):
    steps, save = 10, 5
    base = harness.config("full_shard", 2, **BF16_STATE)
    ref_out, ref = harness.run(base, 2)
    ref_params = harness.load_params(ref_out)
    ckpt = harness.scratch_dir("shardline-bf16-ckpt-")
    saved_out, _ = harness.run(base, 2, extra_args=["--ckpt-dir", ckpt, "--save-at", str(save),
                                                    "--stop-after", str(save)])
    step_dir = os.path.join(ckpt, "tiny", "step-%08d" % save)
    dtypes = set()
    for r in range(2):
        with open(os.path.join(step_dir, f"rank-{r:05d}.safetensors"), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        dtypes |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    checks.check(dtypes == {"BF16"}, "the checkpoint holds bf16 master and moments", str(sorted(dtypes)))
    imported = dcp_round_trip(checks, base, step_dir, harness.load_params(saved_out))
    for strategy, world, src in (("full_shard", 2, step_dir), ("shard_grad_op", 3, step_dir),
                                 ("hybrid_shard", 4, step_dir), ("full_shard", 2, imported)):
        cfg = harness.config(strategy, world, micro_batches=1 if world == 3 else 2, **BF16_STATE)
        out, ranks = harness.run(cfg, world, extra_args=["--resume", src])
        params = harness.load_params(out)
        name = f"resume at N={world} {strategy}" + (" from the DCP export's import" if src == imported else "")
        checks.check(ranks[0]["steps"][0]["step"] == save, f"{name} continues at step {save}")
        if strategy == "full_shard":
            diff = max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in ref_params)
            checks.check(diff == 0.0, f"{name} is bitwise equal at step {steps}", f"max abs diff {diff:.3e}")
        else:
            within(params, ref_params, steps - save, checks, name)
        losses_within([s["loss"] for s in ranks[0]["steps"]], [s["loss"] for s in ref[0]["steps"]][save:], checks,
                      name)


def gpt2_unit_params(m):
    """nanoGPT's parameters by unit, in the order a unit's flat buffer holds
    them (common/model/model_shapes.cc): (name, numel) lists."""
    C, V, T = m["n_embd"], m["vocab_size"], m["block_size"]
    block = [("ln_1.weight", C), ("ln_1.bias", C), ("attn.c_attn.weight", 3 * C * C), ("attn.c_attn.bias", 3 * C),
             ("attn.c_proj.weight", C * C), ("attn.c_proj.bias", C), ("ln_2.weight", C), ("ln_2.bias", C),
             ("mlp.c_fc.weight", 4 * C * C), ("mlp.c_fc.bias", 4 * C), ("mlp.c_proj.weight", 4 * C * C),
             ("mlp.c_proj.bias", C)]
    return ([[("transformer.wte.weight", V * C), ("transformer.wpe.weight", T * C)]] +
            [[(f"transformer.h.{i}.{n}", k) for n, k in block] for i in range(m["n_layer"])] +
            [[("transformer.ln_f.weight", C), ("transformer.ln_f.bias", C)]])


def checkpoint_moments(step_dir, m):
    """Each parameter's (exp_avg, exp_avg_sq) in a checkpoint, by name, as fp32."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        man = json.load(f)
    ranks = sorted((r for r in man["ranks"] if r["rank"] < man["shard_group_size"]), key=lambda r: r["rank"])
    files = [load_file(os.path.join(step_dir, r["file"])) for r in ranks]
    out = {}
    for u, params in zip(man["ownership"], gpt2_unit_params(m)):
        flats = [torch.cat([f[f"{u['unit']}.{kind}"].float() for f in files]) for kind in ("exp_avg", "exp_avg_sq")]
        at = 0
        for name, n in params:
            out[name] = tuple(flat[at:at + n] for flat in flats)
            at += n
        assert at == u["numel"], (u, at)
    return out


def dcp_round_trip(checks, cfg, step_dir, saved):
    """Exports `step_dir` as DCP, loads it into torch as a user does (the
    weights must be `saved`, the run's own at the save), and imports it
    back; returns the import's step folder."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    scratch = harness.scratch_dir("shardline-bf16-dcp-")
    job = os.path.join(scratch, "job.toml")
    harness.write_toml(cfg, job)
    exported = os.path.join(scratch, "dcp")
    r = subprocess.run([SHARDCTL, "ckpt", "export", step_dir, "--format", "dcp", "--job", job, "--out", exported],
                       capture_output=True, text=True, timeout=120)
    checks.check(r.returncode == 0, "ckpt export --format dcp of a bf16-state checkpoint", r.stderr.strip())
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(exported).read_metadata().state_dict_metadata
    kinds = {}
    for k, v in md.items():
        if hasattr(v, "properties"):
            kind = "model" if k.startswith("model.") else k.rsplit(".", 1)[-1]
            kinds.setdefault(kind, set()).add(v.properties.dtype)
    checks.check(kinds == {"model": {torch.bfloat16}, "exp_avg": {torch.bfloat16}, "exp_avg_sq": {torch.bfloat16},
                           "step": {torch.float32}},
                 "the DCP export holds bf16 weights and moments, as torch.optim.AdamW on a bf16 model", str(kinds))
    m, o = cfg["model"], cfg["optimizer"]
    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["vocab_size"], m["block_size"]).to(torch.bfloat16)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=tuple(o["betas"]))
    msd, osd = get_state_dict(model, opt)
    dcp_load({"model": msd, "optim": osd}, checkpoint_id=exported, no_dist=True)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    got = {k: v.float() for k, v in model.state_dict().items()}
    same = all(torch.equal(got[k], torch.from_numpy(saved[k])) for k in saved)
    checks.check(same and sorted(saved) == sorted(k for k in got if k != "lm_head.weight") and
                 all(p.dtype == torch.bfloat16 for p in model.parameters()),
                 "torch dcp.loads the export's bf16 weights bitwise", f"{len(saved)} tensors")
    theirs = checkpoint_moments(step_dir, m)
    bad = []
    for name, param in model.named_parameters():
        st = opt.state.get(param, {})
        for kind, want in zip(("exp_avg", "exp_avg_sq"), theirs[name]):
            t = st.get(kind)
            if t is None or t.dtype != torch.bfloat16 or not torch.equal(t.float().flatten(), want):
                bad.append(f"{name}.{kind}")
    checks.check(not bad and sorted(theirs) == sorted(n for n, _ in model.named_parameters()),
                 "torch.optim.AdamW's loaded moments are bf16 and each parameter's in the checkpoint, bitwise",
                 f"{len(theirs)} parameters" + (f"; differ: {bad[:4]}" if bad else ""))
    r = subprocess.run([SHARDCTL, "--json", "ckpt", "import", exported, "--job", job, "--out",
                        os.path.join(scratch, "imported")], capture_output=True, text=True, timeout=120)
    checks.check(r.returncode == 0, "ckpt import of the export", r.stderr.strip())
    return json.loads(r.stdout)["step_dir"]


def bad_input(checks):
    cases = [({"optimizer__master_dtype": "bf16", "optimizer__moments_dtype": "bf16"},
              '[optimizer] master_dtype = "bf16" updates the parameters in place and needs [precision] '
              'param_dtype = "bf16"'),
             ({"precision__param_dtype": "bf16", "optimizer__master_dtype": "bf16"},
              '[optimizer] moments_dtype = "fp32" with master_dtype = "bf16" is not supported')]
    for overrides, expected in cases:
        try:
            harness.run(harness.config("no_shard", 1, **overrides), 1)
            err = "accepted"
        except harness.RunError as e:
            err = str(e)
        checks.check(expected in err, f"refused: {expected[:60]}...", err[-200:])


def main():
    checks = harness.Checks()
    against_torch(checks)
    ref_out, ref = harness.run(harness.config("no_shard", 1, **BF16_STATE), 1)
    ref_params = harness.load_params(ref_out)
    fp32_state = harness.load_params(harness.run(harness.config(
        "no_shard", 1, precision__param_dtype="bf16", precision__reduce_dtype="bf16"), 1)[0])
    moved = max(float(np.max(np.abs(fp32_state[k] - ref_params[k]))) for k in ref_params)
    checks.check(moved > 0, "bf16 state differs from fp32 state (the setting took effect)", f"{moved:.2e}")
    mem = ref[0]["memory"]
    P = sum(formulas.unit_sizes(harness.TINY["model"]))
    per_param = (mem["params"] + mem["grads"] + mem["master"] + mem["optimizer"]) / P
    checks.check(mem["master"] == 0 and per_param == 8, "no_shard N=1: 8 bytes a parameter, no master",
                 f"{per_param} bytes a parameter, master {mem['master']}")
    strategies(checks, ref_params, [s["loss"] for s in ref[0]["steps"]])
    checkpoints(checks)
    bad_input(checks)
    checks.finish()


if __name__ == "__main__":
    main()
