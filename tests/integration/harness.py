"""Runs shardline-train ranks as separate processes on loopback and reads back
what they wrote (per-rank JSON, final parameters as safetensors).

Used by the integration tests; every process has a deadline, and a failed rank
fails the run with its stderr."""
import atexit
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("SHARDLINE_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TRAIN = os.path.join(BUILD, "worker", "shardline-train")

TINY = {
    "job": {"name": "tiny"},
    "model": {"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 64, "block_size": 16},
    "data": {"format": "synthetic"},
    "train": {"steps": 10, "batch_size": 24, "micro_batch_size": 12, "seed": 1337},
    "optimizer": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 3, "betas": [0.9, 0.95],
                  "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0},
    "parallelism": {"strategy": "no_shard"},
    "precision": {"param_dtype": "fp32", "reduce_dtype": "fp32"},
    "memory": {"activation_checkpointing": False},
    "prefetch": {"forward": True, "backward": "pre", "max_inflight_all_gathers": 2},
}

# Tiny llama-family models shaped like the families it covers (GQA; sizes
# that pad at N=3): tests/oracle/llama_oracle.py holds them to transformers.
LLAMA_MODELS = {
    "llama3": dict(n_kv_head=2, intermediate_size=48, rope_theta=500000.0, rope_scaling="llama3",
                   rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_position=8192, tie_word_embeddings=False),
    "qwen2": dict(n_kv_head=2, intermediate_size=40, rope_theta=1000000.0, qkv_bias=True, tie_word_embeddings=True),
    "qwen3": dict(n_kv_head=1, intermediate_size=40, rope_theta=1000000.0, qk_norm=True, head_dim=16,
                  tie_word_embeddings=True),
}


def llama_model(name):
    """The [model] table of LLAMA_MODELS[name] at TINY's sizes."""
    return {**TINY["model"], "family": "llama", "rms_norm_eps": 1e-5, **LLAMA_MODELS[name]}


# Shard group size used for the hybrid strategies at each world size: both
# levels (sharding inside a group, all-reduce across groups) are exercised at 4.
HYBRID_GROUP = {1: 1, 2: 1, 3: 3, 4: 2}
STRATEGIES = ["no_shard", "zero1", "shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2"]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def write_toml(cfg, path):
    with open(path, "w") as f:
        for section, kv in cfg.items():
            f.write(f"[{section}]\n")
            for k, v in kv.items():
                f.write(f"{k} = {toml_value(v)}\n")


def config(strategy="no_shard", world=1, micro_batches=2, **overrides):
    """The tiny GPT with `micro_batches` micro-batches per rank at `world` ranks."""
    cfg = json.loads(json.dumps(TINY))
    cfg["parallelism"]["strategy"] = strategy
    if strategy.startswith("hybrid"):
        cfg["parallelism"]["shard_group_size"] = HYBRID_GROUP[world]
    cfg["train"]["micro_batch_size"] = cfg["train"]["batch_size"] // world // micro_batches
    for key, value in overrides.items():
        section, name = key.split("__")
        cfg[section][name] = value
    return cfg


# The benchmarks' small GPT (bench/engine_bench.py, bench/torch_compare.py,
# plan_check.py): one model, so their figures compare.
SMALL_GPT = {"n_layer": 6, "n_head": 8, "n_embd": 512, "vocab_size": 16384, "block_size": 256}


def small_gpt_config(strategy, world, steps, batch):
    """SMALL_GPT at `world` ranks, one micro-batch of batch/world sequences per
    rank; hybrid strategies shard over groups of world/2."""
    cfg = config(strategy, world, micro_batches=1)
    cfg["model"] = dict(SMALL_GPT)
    cfg["train"].update(steps=steps, batch_size=batch, micro_batch_size=batch // world)
    if strategy.startswith("hybrid"):
        cfg["parallelism"]["shard_group_size"] = max(1, world // 2)
    return cfg


def free_ports(n):
    """`n` distinct ports that nothing else takes between this check and
    their servers' binds: drawn at random below the kernel's ephemeral range.
    A port bind(0) hands out is in that range, where every outgoing
    connection (Gloo's, another test's: ctest runs two at a time) draws its
    own, and one did take such a port before rank 0's store bound it. Each
    stays bound until all are drawn, so no two are the same."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    rng = random.SystemRandom()
    held = []
    try:
        for _ in range(100 * n):
            if len(held) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(10000, max(ephemeral, 10001))))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise RunError(f"no {n} free ports in 10000-{ephemeral - 1} after {100 * n} draws")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def free_port():
    return free_ports(1)[0]


class RunError(Exception):
    pass


_scratch_dirs = []


def _remove_scratch_dirs():
    if os.environ.get("SHARDLINE_KEEP_SCRATCH"):
        print("kept " + " ".join(d for d, _ in _scratch_dirs), file=sys.stderr)
        return
    for d, pid in _scratch_dirs:
        if pid == os.getpid():  # not in a forked child that inherited the list
            shutil.rmtree(d, ignore_errors=True)


atexit.register(_remove_scratch_dirs)


def _as_array(x):
    import numpy as np
    return x.detach().double().cpu().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)


# The relative error a gradient component may carry when only the order of
# its sums changes (per-rank partial sums reduced in a ring, micro-batches
# accumulated in another order): about K * u * kappa for K summands, u = 6e-8
# (fp32) and kappa = sum|g_i| / |sum g_i|, the cancellation in that component.
# A component whose terms cancel by ~1e4 (common in small weights and biases)
# carries ~3e-3 with K ~ 8.
REORDER_GRAD_REL = 3e-3


def reorder_param_tol(lr, steps):
    """How far two correct fp32 runs that differ only in summation order may
    end apart, in any ordinary parameter, after `steps` AdamW steps at peak
    learning rate `lr`: Adam's step lr * m / (sqrt(v) + eps) is scale-free in
    the gradient, so a relative error d in it moves the step by at most
    ~lr * d, and the steps add up: steps * lr * REORDER_GRAD_REL (2e-5 at lr
    6e-4 over 10 steps, the README's bound). Components whose true gradient is
    zero are apart (param_diffs)."""
    return steps * lr * REORDER_GRAD_REL


def param_diffs(got, want):
    """(max abs difference over every parameter but the key third of each
    attn.c_attn.bias, max abs difference over those key thirds).

    The key bias b_k adds q . b_k to every score of a query q: the same constant
    for all keys, which the softmax cancels (softmax(s + c) = softmax(s)). Its
    true gradient is therefore exactly zero, and what a run computes there is
    rounding noise (sums of terms that cancel, taken in a kernel's own order).
    Adam divides by the root of the noise's own second moment, m / (sqrt(v) +
    eps), so that noise becomes steps of up to ~lr of either sign whatever its
    size (once above eps = 1e-8): two correct runs can drift apart there by up to ~2 * lr per step,
    which no tolerance on rounding can hold: it is bounded by 2 * lr * steps. The query and value thirds are ordinary
    parameters and stay with the rest."""
    import numpy as np
    rest = key = 0.0
    for k in want:
        d = np.abs(_as_array(got[k]) - _as_array(want[k]))
        if k.endswith("attn.c_attn.bias"):
            c = d.shape[0] // 3  # [q | k | v]
            key = max(key, float(d[c:2 * c].max()))
            d = np.concatenate([d[:c], d[2 * c:]])
        rest = max(rest, float(d.max()))
    return rest, key


def step0_dump(cfg, prefix):
    """shardline-train --dump-grads of `cfg` (one process) in a scratch
    directory: its step-0 weights, gradients and every step's batches, as
    torch tensors by name."""
    from safetensors.torch import load_file
    out = os.path.join(scratch_dir(prefix), "dump.safetensors")
    path = os.path.join(os.path.dirname(out), "job.toml")
    write_toml(cfg, path)
    subprocess.run([TRAIN, "--config", path, "--dump-grads", out], check=True, timeout=120)
    return load_file(out)


def spread(values, fmt):
    """A benchmark's figure: the median of `values` in `fmt`, with [min-max]
    where they differ."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return fmt.format(mid) if lo == hi else f"{fmt.format(mid)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def scratch_dir(prefix):
    """A temporary directory removed when the test's process exits (SHARDLINE_KEEP_SCRATCH=1 keeps them)."""
    d = tempfile.mkdtemp(prefix=prefix)
    _scratch_dirs.append((d, os.getpid()))
    return d


def wait_ranks(procs, timeout, done=lambda r: False, what=""):
    """Waits for every rank process (stdout/stderr piped, stderr read) within
    `timeout` s in all, killing them all past it; a rank that exits non-zero
    is an error (RunError naming every such rank) unless done(rank) says it
    wrote its report first (a crash at teardown)."""
    deadline = time.time() + timeout
    errors = []
    prefix = f"{what}: " if what else ""
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RunError(f"{prefix}rank {r} did not finish within {timeout}s")
        if p.returncode != 0 and not done(r):
            errors.append(f"rank {r} exited {p.returncode}: {(err or '').strip()}")
    if errors:
        raise RunError(prefix + "; ".join(errors))


def run(cfg, world, timeout=120, extra_args=(), threads=1, rank_env=None):
    """Runs `world` ranks to completion; returns (out_dir, [rank json]).
    rank_env(r), where given, is what rank r's process adds to this one's
    environment (a per-rank NCCL_HOSTID, say)."""
    out = scratch_dir("shardline-")
    path = os.path.join(out, "job.toml")
    write_toml(cfg, path)
    port = free_port()
    procs = []
    for r in range(world):
        args = [TRAIN, "--config", path, "--rank", str(r), "--world", str(world), "--store-port", str(port),
                "--threads", str(threads), "--out", out, "--timeout", "60", *extra_args]
        env = dict(os.environ, **rank_env(r)) if rank_env else None
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    wait_ranks(procs, timeout)
    ranks = []
    for r in range(world):
        with open(os.path.join(out, f"rank-{r}.json")) as f:
            ranks.append(json.load(f))
    return out, ranks


def load_params(out):
    from safetensors.numpy import load_file
    return load_file(os.path.join(out, "params.safetensors"))


def write_llmc(path, values, magic=20240520, version=1, dtype=None):
    """An llm.c-style file: a 256 x int32 header (magic, version, count), then
    the values (uint16 tokens by default; masks: magic 20240905, uint8)."""
    import numpy as np
    dtype = dtype or {20240520: np.uint16, 20240801: np.uint32, 20240905: np.uint8}[magic]
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (magic, version, len(values))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(values, dtype=dtype).tobytes())


def refused_at_submit(checks, label, job, expected):
    """`shardctl submit job` fails before connecting (no coordinator at the
    address), in one line on stderr that contains `expected`."""
    shardctl = os.path.join(BUILD, "client", "shardctl")
    r = subprocess.run([shardctl, "--coordinator", "127.0.0.1:1", "submit", job], capture_output=True, text=True,
                       timeout=60)
    err = r.stderr.strip()
    checks.check(r.returncode == 1 and expected in err and len(err.splitlines()) == 1, f"refused: {label}", err)


class Checks:
    """Collects named pass/fail results and prints the closing line ctest reads."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, ok, name, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {name} {detail}".rstrip())
        else:
            self.failed.append(name)
            print(f"FAIL {name} {detail}".rstrip())
        sys.stdout.flush()
        return ok

    def remove_unless_failed(self, path):
        """Removes a test's scratch directory, or keeps it for a look when a check failed."""
        if self.failed:
            print(f"kept {path} for a look")
        else:
            shutil.rmtree(path, ignore_errors=True)

    def finish(self):
        """Exit 0 only when checks ran and none failed: a test that checked
        nothing (a loop over an empty list, an early return) is a failure."""
        print(f"{self.passed} passed, {len(self.failed)} failed")
        if not self.passed and not self.failed:
            print("FAIL no check ran")
        sys.exit(1 if self.failed or not self.passed else 0)

    def skip(self, why):
        """Ends the test as skipped (exit 77, ctest's SKIP_RETURN_CODE), saying why."""
        print(f"SKIP {why}")
        sys.stdout.flush()
        sys.exit(77)
