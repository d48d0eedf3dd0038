"""The engine on a CUDA device (ctest label gpu; exits 77 where there is none).

    engine_gpu.py [numerics|llama|nccl|shared_gpu|memory]   (default: all five)

numerics   One rank on cuda:0, fp32 with TF32 off, 10 steps of the tiny GPT
           (2 micro-batches, clipping, warmup and cosine): parameters within
           1e-4 max abs of the CPU engine's and of PyTorch's own training of
           the same model on cuda:0 (torch.optim.AdamW, clip_grad_norm_), and
           losses within 1e-5 relative. bf16 params with fp32 reduction: the
           loss curve within 2^-8 relative of the CPU engine's bf16 run, and
           parameters within 0.2 * lr * steps (see Tolerances).
llama      The tiny Qwen3 (q/k norm, GQA 4:1, tied head) with LoRA r = 8 on
           every projection and activation checkpointing, one rank on
           cuda:0: fp32 with TF32 off within 1e-4 (params: base and
           adapters) and 1e-5 (losses) of the CPU engine after 10 steps, as
           numerics; bf16 the loss curve within 2^-8 and the adapters within
           0.2 * lr * steps.
nccl       Ranks over NCCL on this GPU, each rank process a host of its own
           (a different NCCL_HOSTID: NCCL 2.28 refuses two ranks of one host
           on one GPU and then connects them over sockets on loopback), or
           with NCCL_MULTI_RANK_GPU_ENABLE=1 where the loaded NCCL is 2.30+:
           full_shard N = 2 and hybrid_shard 2 x 2, the tiny GPT and the tiny
           Qwen3 + LoRA, each within 1e-4 (params) and 1e-5 (losses) of the
           one-rank cuda:0 run, bytes per collective equal to the ring
           formulas. The gate is the NCCL the programs load (nccl_test
           --nccl-version), never torch.cuda.nccl.version(), torch's
           compile-time constant; a case that cannot run fails.
shared_gpu Several ranks sharing cuda:0: N = 2 and 4 processes over Gloo
           (CUDA buffers staged through host memory) for every strategy equal
           the one-rank cuda:0 run within 1e-4 (params) and 1e-5 (losses),
           and their bytes per collective equal the ring formulas; so do
           the sparse embedding's runs (full_shard N = 2, and hybrid_shard
           N = 4 at vocabulary 1024 against a one-rank run there) and
           hybrid_shard's with its optimizer across the replicas (N = 4).
memory     Per strategy at N = 1: the engine's ledger (state, and its peak
           with activations) against the CUDA caching allocator's peak of
           allocated and reserved bytes, as a table; the ledger's peak may not
           exceed the allocator's (it counts a subset of the same bytes).

Tolerances. fp32 on CPU and GPU runs the same arithmetic with other kernels
(cuBLAS, SDPA's GPU kernels): sums are taken in other orders, so each op
differs by a few ulp (~1e-7 relative) and 10 Adam steps of lr 6e-4 amplify
that to ~1e-5 at most; 1e-4 leaves margin and still catches any real error (a
stale shard or a wrong reduction moves parameters by ~lr = 6e-4 per step).
In bf16 (unit roundoff u = 2^-8) the CPU and the GPU round activations and
partial sums differently at every op: per-token losses differ by O(u)
relative and their mean by less, so the loss curve is held to u; parameters
are held to 0.2 * lr * steps as in tests/integration/bf16.py.
In both precisions the key third of each c_attn.bias is held apart, to
2 * lr * steps (param_diffs says why): its true gradient is zero, so what
either run computes there is rounding noise, which Adam turns into steps of
up to ~lr.
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import formulas  # noqa: E402
import harness  # noqa: E402
from nanogpt import train_reference  # noqa: E402

GPU = ("--device", "cuda:0")
STEPS = harness.TINY["train"]["steps"]
LR = harness.TINY["optimizer"]["lr"]


# The bound on the key third of c_attn.bias (harness.param_diffs): each of the two
# runs moves it by at most ~lr per step, of either sign.
KEY_BIAS_TOL = 2 * LR * STEPS


def check_params(checks, name, got, want, tol):
    """The parameters within tol, and the key bias within KEY_BIAS_TOL."""
    d, kd = harness.param_diffs(got, want)
    checks.check(d <= tol, f"{name}: params", f"max abs diff {d:.2e} (tol {tol:.1e}; key bias apart)")
    checks.check(kd <= KEY_BIAS_TOL, f"{name}: key bias (zero true gradient)",
                 f"max abs diff {kd:.2e} = {kd / LR:.2f} lr (tol 2 * lr * steps = {KEY_BIAS_TOL:.1e})")


def losses_of(ranks):
    return [s["loss"] for s in ranks[0]["steps"]]


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def numerics(checks):
    cfg = harness.config("no_shard", 1, micro_batches=2)
    cpu_out, cpu = harness.run(cfg, 1)
    gpu_out, gpu = harness.run(cfg, 1, extra_args=GPU)
    checks.check(gpu[0].get("device") == "cuda:0", "the run computed on cuda:0", str(gpu[0].get("device")))
    cpu_p, gpu_p = harness.load_params(cpu_out), harness.load_params(gpu_out)
    check_params(checks, "fp32 cuda:0 vs CPU engine", gpu_p, cpu_p, 1e-4)
    r = max_rel(losses_of(gpu), losses_of(cpu))
    checks.check(r <= 1e-5, "fp32 cuda:0 vs CPU engine: losses", f"max rel diff {r:.2e} (tol 1e-5)")

    # PyTorch on the same GPU, same weights and batches, TF32 off.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dump_path = os.path.join(harness.tempfile.mkdtemp(prefix="shardline-gpu-"), "dump.safetensors")
    job = os.path.join(os.path.dirname(dump_path), "job.toml")
    harness.write_toml(cfg, job)
    subprocess.run([harness.TRAIN, "--config", job, "--dump-grads", dump_path], check=True, timeout=120)
    ref, ref_losses = train_reference(load_file(dump_path), cfg, device="cuda:0")
    ref.pop("lm_head.weight")  # PyTorch's alias of the tied transformer.wte.weight, which the engine saves once
    got = load_file(os.path.join(gpu_out, "params.safetensors"))
    check_params(checks, "fp32 cuda:0 vs PyTorch on cuda:0", got, ref, 1e-4)
    r = max_rel(losses_of(gpu), ref_losses)
    checks.check(r <= 1e-5, "fp32 cuda:0 vs PyTorch on cuda:0: losses", f"max rel diff {r:.2e} (tol 1e-5)")

    bf16 = harness.config("no_shard", 1, micro_batches=2, precision__param_dtype="bf16",
                          precision__reduce_dtype="fp32")
    cpu_out, cpu = harness.run(bf16, 1)
    gpu_out, gpu = harness.run(bf16, 1, extra_args=GPU)
    r = max_rel(losses_of(gpu), losses_of(cpu))
    checks.check(r <= 2 ** -8, "bf16 cuda:0 vs CPU engine: loss curve", f"max rel diff {r:.2e} (tol {2 ** -8:.1e})")
    cpu_p, gpu_p = harness.load_params(cpu_out), harness.load_params(gpu_out)
    check_params(checks, "bf16 cuda:0 vs CPU engine", gpu_p, cpu_p, 0.2 * LR * STEPS)


def shared_gpu(checks):
    runs = [(s, w, "gloo", {}, {}) for s in harness.STRATEGIES for w in (2, 4)]
    # The sparse embedding (GPT-2's tied wte and wpe looked up and reduced as
    # rows, the table gathered for the head alone) on the device: within the
    # shard group at N = 2, and at vocabulary 1024 with hybrid_shard N = 4,
    # where the rows' gradients are also gathered across the replicas
    # (SparseEmbedding::RowsBeatAllReduce) and the head computes over the
    # world (comm::HeadOverWorldBeatsAllReduce: its exchanges in two stages,
    # the table's parts gathered across the replicas).
    sparse = {"parallelism__sparse_embedding": True}
    runs += [("full_shard", 2, "gloo", {}, sparse),
             ("hybrid_shard", 4, "gloo", {}, dict(sparse, model__vocab_size=1024))]
    # hybrid_shard's optimizer across the replicas: the pieces' gathers on
    # the replicas' communicator, each unit's gather queued after its own
    # (Gloo: AllGatherAfter on the host; NCCL: the all-gather stream's order).
    pieces = {"parallelism__shard_optimizer_across_replicas": True}
    runs += [("hybrid_shard", 4, "gloo", {}, pieces)]
    refs = {}  # vocabulary -> (params, ranks) of the one-rank cuda:0 run
    for strategy, world, backend, env, keys in runs:
        cfg = harness.config(strategy, world, **keys)
        vocab = cfg["model"]["vocab_size"]
        if vocab not in refs:
            refs[vocab] = one_rank(harness.config("no_shard", 1, model__vocab_size=vocab))
        label = (" sparse embedding" if keys.get("parallelism__sparse_embedding") else "") + (
            " optimizer across replicas" if keys.get("parallelism__shard_optimizer_across_replicas") else "")
        check_against_one_rank(checks, f"{strategy} N={world} {backend}{label} on cuda:0", cfg, world, backend,
                               refs[vocab])


def one_rank(cfg):
    """(params, ranks) of `cfg` on one rank on cuda:0."""
    out, ranks = harness.run(cfg, 1, extra_args=GPU)
    return harness.load_params(out), ranks


def check_against_one_rank(checks, name, cfg, world, backend, ref, rank_env=None):
    """`cfg` at `world` ranks on cuda:0 over `backend` equals the one-rank run
    `ref` (params 1e-4, losses 1e-5: the Tolerances), and rank 0's bytes per
    collective are the ring formulas'."""
    ref_p, ref_ranks = ref
    out, ranks = harness.run(cfg, world, timeout=300, extra_args=GPU + ("--backend", backend), rank_env=rank_env)
    check_params(checks, name, harness.load_params(out), ref_p, 1e-4)
    r = max_rel(losses_of(ranks), losses_of(ref_ranks))
    checks.check(r <= 1e-5, f"{name}: losses", f"max rel diff {r:.2e} (tol 1e-5)")
    expected = formulas.comm_bytes(cfg, world, cfg["train"]["steps"])
    got = {(c, op): ranks[0]["comm"][c][op]["bytes"] for (c, op) in expected}
    checks.check(got == expected, f"{name}: bytes per collective", "" if got == expected else f"{got} vs {expected}")


def tiny_qwen3_lora(strategy="no_shard", world=1, **overrides):
    """The tiny Qwen3 with LoRA r = 8 (alpha 16) on every projection, under activation checkpointing."""
    cfg = harness.config(strategy, world, memory__activation_checkpointing=True, **overrides)
    cfg["model"] = harness.llama_model("qwen3")
    cfg["lora"] = {"rank": 8, "alpha": 16, "target_modules": "all-linear"}
    return cfg


def llama(checks):
    cfg = tiny_qwen3_lora()
    cpu_out, cpu = harness.run(cfg, 1)
    gpu_out, gpu = harness.run(cfg, 1, extra_args=GPU)
    checks.check(gpu[0].get("device") == "cuda:0", "qwen3 + LoRA: the run computed on cuda:0", str(gpu[0].get("device")))
    cpu_l, gpu_l = losses_of(cpu), losses_of(gpu)
    checks.check(cpu_l[-1] < cpu_l[0], "qwen3 + LoRA: the CPU engine's loss falls", f"{cpu_l[0]:.4f} -> {cpu_l[-1]:.4f}")
    cpu_p, gpu_p = harness.load_params(cpu_out), harness.load_params(gpu_out)
    checks.check(any("lora" in k for k in cpu_p), "qwen3 + LoRA: the saved parameters hold the adapters",
                 ", ".join(sorted(cpu_p)[:3]))
    check_params(checks, "qwen3 + LoRA fp32 cuda:0 vs CPU engine", gpu_p, cpu_p, 1e-4)
    r = max_rel(gpu_l, cpu_l)
    checks.check(r <= 1e-5, "qwen3 + LoRA fp32 cuda:0 vs CPU engine: losses", f"max rel diff {r:.2e} (tol 1e-5)")

    # QLoRA's NF4 base: the dequantization is elementwise (a table lookup and
    # fp32 products, exact in IEEE on either device), so the base is the CPU
    # engine's bitwise and the bounds are the fp32 LoRA run's.
    nf4 = tiny_qwen3_lora()
    nf4["lora"]["base_dtype"] = "nf4"
    cpu_out, cpu = harness.run(nf4, 1)
    gpu_out, gpu = harness.run(nf4, 1, extra_args=GPU)
    check_params(checks, "qwen3 + QLoRA (NF4 base) fp32 cuda:0 vs CPU engine", harness.load_params(gpu_out),
                 harness.load_params(cpu_out), 1e-4)
    r = max_rel(losses_of(gpu), losses_of(cpu))
    checks.check(r <= 1e-5, "qwen3 + QLoRA (NF4 base) fp32 cuda:0 vs CPU engine: losses", f"max rel diff {r:.2e} (tol 1e-5)")

    bf16 = tiny_qwen3_lora(precision__param_dtype="bf16", precision__reduce_dtype="fp32")
    cpu_out, cpu = harness.run(bf16, 1)
    gpu_out, gpu = harness.run(bf16, 1, extra_args=GPU)
    r = max_rel(losses_of(gpu), losses_of(cpu))
    checks.check(r <= 2 ** -8, "qwen3 + LoRA bf16 cuda:0 vs CPU engine: loss curve",
                 f"max rel diff {r:.2e} (tol {2 ** -8:.1e})")
    cpu_p, gpu_p = harness.load_params(cpu_out), harness.load_params(gpu_out)
    adapters = [k for k in cpu_p if "lora" in k]
    d, _ = harness.param_diffs({k: gpu_p[k] for k in adapters}, {k: cpu_p[k] for k in adapters})
    tol = 0.2 * LR * STEPS
    checks.check(d <= tol, "qwen3 + LoRA bf16 cuda:0 vs CPU engine: adapters", f"max abs diff {d:.2e} (tol {tol:.1e})")


def loaded_nccl_version():
    """The version code (22809 = 2.28.9) of the NCCL the build's programs load."""
    p = subprocess.run([os.path.join(harness.BUILD, "tests", "nccl_test"), "--nccl-version"], capture_output=True,
                       text=True, timeout=60)
    return int(p.stdout.strip()) if p.returncode == 0 and p.stdout.strip().isdigit() else 0


def nccl_rank_env(version):
    """What each NCCL rank process sharing cuda:0 adds to its environment."""
    if version >= 23000:
        return lambda r: {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    return lambda r: {"NCCL_HOSTID": f"shardline-rank-{r}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def nccl(checks):
    version = loaded_nccl_version()
    if not checks.check(version > 0, "the loaded NCCL's version", str(version)):
        return
    how = "NCCL_MULTI_RANK_GPU_ENABLE=1" if version >= 23000 else "a host id per rank"
    print(f"NCCL {version}: ranks on one GPU with {how}")
    env = nccl_rank_env(version)
    models = [("tiny GPT", lambda s, w: harness.config(s, w)), ("tiny Qwen3 + LoRA", tiny_qwen3_lora)]
    for label, make in models:
        ref = one_rank(make("no_shard", 1))
        for strategy, world in (("full_shard", 2), ("hybrid_shard", 4)):
            cfg = make(strategy, world)
            shape = f"N={world}" if strategy == "full_shard" else f"{world // cfg['parallelism']['shard_group_size']}x" \
                f"{cfg['parallelism']['shard_group_size']}"
            check_against_one_rank(checks, f"{label} {strategy} {shape} nccl on cuda:0", cfg, world, "nccl", ref,
                                   rank_env=env)


def memory(checks):
    print(f"{'strategy':<20}{'state MiB':>11}{'ledger peak':>13}{'alloc peak':>12}{'reserved':>10}{'ledger/alloc':>14}")
    for strategy in harness.STRATEGIES:
        cfg = harness.small_gpt_config(strategy, 1, steps=3, batch=8)
        cfg["precision"] = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
        _, ranks = harness.run(cfg, 1, timeout=300, extra_args=GPU)
        m = ranks[0]["memory"]
        mib = 1 << 20
        print(f"{strategy:<20}{m['state'] / mib:>11.1f}{m['peak'] / mib:>13.1f}{m['tensor_peak'] / mib:>12.1f}"
              f"{m['reserved_peak'] / mib:>10.1f}{m['peak'] / max(m['tensor_peak'], 1):>14.2f}")
        checks.check(0 < m["peak"] <= m["tensor_peak"] <= m["reserved_peak"],
                      f"{strategy}: ledger peak <= allocated peak <= reserved peak")


def main():
    if torch.cuda.device_count() == 0:
        print("no CUDA device: skipped")
        sys.exit(77)
    parts = sys.argv[1:] or ["numerics", "llama", "nccl", "shared_gpu", "memory"]
    checks = harness.Checks()
    for part in parts:
        {"numerics": numerics, "llama": llama, "nccl": nccl, "shared_gpu": shared_gpu, "memory": memory}[part](checks)
    checks.finish()


if __name__ == "__main__":
    main()
