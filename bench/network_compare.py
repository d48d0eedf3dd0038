"""Shardline against PyTorch FSDP2 where the network is the bottleneck: ranks on
emulated hosts (tests/hosts.py: one network namespace per host on a bridge)
whose egress is shaped to a known bandwidth (tc tbf), side by side in one run.

Placements:
    4x1   4 hosts, one rank each: every collective crosses the links.
    2x2   2 hosts, two ranks each: hybrid_shard's shard groups are the hosts
          (ranks 0,1 and 2,3 talk over their host's loopback), only the
          all-reduce across replicas crosses the link; full_shard's ring
          crosses it in every collective.
    2x1   2 hosts, one rank each: on a 2-core machine, a core per rank, so
          that the overlap the schedule gets can be told apart from what
          ranks sharing cores cost it (full_shard only).

Both sides train the same model on the same tokens with the same global batch,
AdamW and clipping (bench/torch_compare.py's peers: FSDP2 fully_shard per
block, HSDP on a (replicate, shard) mesh; Gloo over the hosts' eth0), one
intra-op thread per rank (the machine's cores are shared by every rank).
Every (placement, strategy, bandwidth) runs `--repeats` times, Shardline and
PyTorch alternating, and the table gives medians with the spread [min, max].

Columns:
    sl_tok/s, pt_tok/s   tokens/s over the timed steps (the first is a warm-up)
    ratio                median of the per-repeat ratios sl/pt
    comm                 seconds per step Shardline's collectives ran (its
                         communication threads; what the link forces)
    exposed              seconds per step its step thread waited on them
    AG / RS / AR         exposed, split: waits on all-gathers, reduce-scatters, all-reduces
    compute              step - exposed (the optimizer included)
    optim                seconds per step in the optimizer's update
    bound                max(0, comm - compute) + 10% of the step: issue 26's
                         goal for `exposed`
    sl_rss, pt_rss       peak RSS of the largest rank, MiB
    plan s, err          `shardctl plan`'s predicted step time for the row's
                         job and placement, and its error against sl's median
                         step (issue 26: within 10%). The planner is given this
                         machine's figures, measured apart from the engine:
                         FLOP/s of PyTorch's forward and backward of the same
                         model at one rank's batch on one thread (FLOPs
                         counted as the planner counts them; under --lora,
                         PEFT's model and LoRA's FLOPs), times the share
                         of the cores each rank gets (cores / ranks), and
                         memory bandwidth, once before the runs; Gloo's bus
                         bandwidth on loopback (a host's ranks share it), and
                         from it the CPU each byte sent costs on these cores
                         (--comm-cpu-per-byte); and, per bandwidth, the bus
                         bandwidth of Shardline's all-gather over 4 shaped
                         hosts (collective_bench, one rank per host). A ring
                         over hosts whose ranks are consecutive sends one
                         stream out of each host at a time, so full_shard's
                         ranks are given that whole; hybrid's all-reduces
                         across replicas run from every rank of a host at
                         once, so each gets its share.
Under the table, a line per point says where the cores went in Shardline's
steps: every rank's CPU seconds against the cores' (how busy), and per rank
the step thread's CPU within its compute seconds and the other threads' (the
transport's); and the bus bandwidth the shard group's all-gathers and
reduce-scatters got in the run (bytes sent over the seconds they ran, waits
for a late peer included), against the all-gather's alone, where that group
spans hosts. After each bandwidth, a line names the strategy the planner recommends for
each placement among those measured, and the one that measured fastest.
`--replan FILE` recomputes the plan columns and lines of a table this program
saved, from the figures its title records (the planner alone runs).

Needs root (network namespaces). Usage:
    .venv/bin/python bench/network_compare.py [--model gpt|llama100m] [--lora R] [--sparse-embedding]
        [--points 4x1:full_shard,2x2:full_shard,2x2:hybrid_shard] [--mbits 100,300,1000]
        [--repeats 3] [--steps 4] [--batch 8] [--seq T] [--save bench/results/FILE.md] [--trace DIR]
    .venv/bin/python bench/network_compare.py --replan bench/results/FILE.md
"""
import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))

import harness  # noqa: E402
import hosts as emulated  # noqa: E402
import plan_accuracy  # noqa: E402
import torch_compare  # noqa: E402

PLACEMENTS = {"4x1": (4, 1), "2x2": (2, 2), "2x1": (2, 1)}  # hosts x ranks per host
PORT = 29500  # every host is its own namespace: a fixed port is free on each
TIMEOUT = 3600


def rank_hosts(hs, per_host):
    """Rank r's host: consecutive ranks share a host."""
    return [hs[r // per_host] for r in range(len(hs) * per_host)]


def run_shardline(ranks, cfg, steps, trace=""):
    """Per step of rank 0: seconds, exposed (and its all-gather and
    reduce-scatter parts), optimizer and comm; every rank's peak RSS.
    `trace`: a folder to keep every rank's timeline in (--trace)."""
    world = len(ranks)
    out = tempfile.mkdtemp(prefix="net-compare-sl-")
    path = os.path.join(out, "job.toml")
    harness.write_toml(cfg, path)
    procs = [h.popen([harness.TRAIN, "--config", path, "--rank", str(r), "--world", str(world),
                      "--store-host", ranks[0].address, "--store-port", str(PORT), "--interface", h.interface,
                      "--threads", "1", "--out", out, "--timeout", "600"] + (["--trace"] if trace else []),
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r, h in enumerate(ranks)]
    harness.wait_ranks(procs, TIMEOUT, what="shardline")
    reports = [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(world)]
    if trace:
        os.makedirs(trace, exist_ok=True)
        for r in range(world):
            shutil.copy(os.path.join(out, f"trace-rank-{r}.json"), trace)
    shutil.rmtree(out, ignore_errors=True)  # params.safetensors: 100 MB a run
    timed = reports[0]["steps"][1:]
    step = sum(s["seconds"] for s in timed) / len(timed)

    def mean(key, report=reports[0]):  # over the timed steps
        return sum(s[key] for s in report["steps"][1:]) / len(timed)
    exposed = mean("exposed_comm_seconds")
    # The communication threads' seconds per step (the warm-up's included),
    # less the fp32 gather of the trained parameters for params.safetensors
    # after the last step, at the all-gathers' measured seconds per byte.
    ops = reports[0]["comm"]
    g = reports[0]["shard_group_size"]
    total = sum(op["seconds"] for c in ops.values() for op in c.values())
    ag = ops["shard"]["all_gather"]
    final_gather = sum(u["shard"] for u in reports[0]["units"]) * (g - 1) * 4
    comm = (total - ag["seconds"] * final_gather / max(1, ag["bytes"])) / steps
    # CPU per step, every rank's: where the shared cores' seconds went.
    cpu = [mean("cpu_seconds", r) for r in reports]
    thread = [mean("step_thread_cpu_seconds", r) for r in reports]
    return {"step": step, "exposed": exposed, "comm": comm, "ag": mean("exposed_all_gather_seconds"),
            "rs": mean("exposed_reduce_scatter_seconds"), "opt": mean("optimizer_seconds"),
            "rss": max(r["memory"]["peak_rss"] for r in reports), "loss": reports[0]["steps"][-1]["loss"],
            # The shard group's all-gathers and reduce-scatters as the run
            # had them (its steps, and the all-gather of the trained
            # parameters after them): bytes each rank sent over the seconds
            # they ran, the bus bandwidth collective_bench measures alone.
            "ag_busbw": ag["bytes"] / max(ag["seconds"], 1e-9),
            "rs_busbw": ops["shard"]["reduce_scatter"]["bytes"] / max(ops["shard"]["reduce_scatter"]["seconds"], 1e-9),
            "cpu": sum(cpu), "cpu_step_thread": statistics.mean(thread),
            "cpu_other": statistics.mean(c - t for c, t in zip(cpu, thread))}


def run_torch(ranks, a, strategy, data):
    world = len(ranks)
    out = tempfile.mkdtemp(prefix="net-compare-pt-")
    env = dict(os.environ, GLOO_SOCKET_IFNAME=ranks[0].interface, OMP_NUM_THREADS="1")
    procs = [h.popen([sys.executable, torch_compare.__file__, "--torch-rank", str(r), "--world", str(world),
                      "--master", ranks[0].address, "--port", str(PORT), "--threads", "1",
                      "--strategy", strategy, "--steps", str(a.steps), "--batch", str(a.batch), "--data", data,
                      "--out", out, "--model", a.model, "--seq", str(a.seq), "--lora", str(a.lora)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
             for r, h in enumerate(ranks)]
    # FSDP2 ranks on a 100 Mbit/s link at times abort in Gloo's teardown
    # ("terminate called without an active exception") after their report.
    harness.wait_ranks(procs, TIMEOUT, what="pytorch", done=lambda r: os.path.exists(os.path.join(out, f"torch-{r}.json")))
    reports = [json.load(open(os.path.join(out, f"torch-{r}.json"))) for r in range(world)]
    shutil.rmtree(out, ignore_errors=True)
    times = reports[0]["times"][1:]
    return {"step": sum(times) / len(times), "rss": max(r["peak_rss"] for r in reports),
            "loss": reports[0]["losses"][-1]}


def shardline_config(a, strategy, world, per_host, model, data):
    cfg = harness.small_gpt_config(strategy, world, a.steps, a.batch)
    cfg["model"] = dict(model)
    cfg["data"] = {"format": "llmc", "path": data}
    cfg["optimizer"]["warmup_steps"] = 2
    if strategy.startswith("hybrid"):
        cfg["parallelism"]["shard_group_size"] = per_host if per_host > 1 else world // 2
    if a.lora:
        cfg["lora"] = {"rank": a.lora, "alpha": 2 * a.lora, "target_modules": "all-linear", "base": "sharded"}
    cfg["parallelism"]["sparse_embedding"] = a.sparse_embedding
    if a.max_inflight_all_gathers:
        cfg.setdefault("prefetch", {})["max_inflight_all_gathers"] = a.max_inflight_all_gathers
    if strategy == "hybrid_shard" and a.shard_optimizer_across_replicas:
        cfg["parallelism"]["shard_optimizer_across_replicas"] = True
    return cfg


class FlopRate:
    """FLOP/s of one thread on one rank's batch, measured apart from the
    engine each time it is called: the planner's compute input. FLOPs are counted as the planner counts them (shardctl plan's
    flops_per_token of the full model: the token lookup is none), else the
    rate it is given and its FLOP count disagree (the llama's table is a
    quarter of its parameters). Under --lora the step timed is PEFT's, and
    its FLOPs are LoRA's as the planner counts them (4 per frozen weight, 6
    per adapter weight): the adapters' scale-and-add over each projection's
    output is memory-bound work the planner counts no FLOPs for, which a
    full model's rate leaves out.

    This VM's speed drifts within a run: two points back to back computed
    the same step in 2.87 and 3.30 s (network_compare_gpt_sparse.md, the
    last section). So main() measures the rate again before every repeat
    and gives the planner each point's median: the planner's error is then
    its model's, not the drift between the start of the run and the point."""

    def __init__(self, a, model, work):
        import torch
        torch.set_num_threads(1)
        net, _, loss_of = torch_compare.torch_model(a.model, model)
        if a.lora:
            net = torch_compare.with_lora(net, a.model, a.lora)
        micro = max(1, a.batch // 4)
        T, V = model["block_size"], model["vocab_size"]
        x = torch.randint(0, V, (micro, T))
        self._step = lambda: loss_of(net, x, x).backward()
        job = os.path.join(work, "calibrate-job.toml")
        harness.write_toml(shardline_config(a, "full_shard", 1, 1, model, os.path.join(work, "tokens.bin")), job)
        r = subprocess.run([plan_accuracy.SHARDCTL, "--json", "plan", job, "--workers", "1"], capture_output=True,
                           text=True, timeout=60, check=True)
        self._flops = json.loads(r.stdout)["flops_per_token"] * micro * T

    def __call__(self):
        return self._flops / plan_accuracy.best_time(self._step)


def calibrate(rate):
    """(FLOP/s, memory bytes/s, Gloo bus bytes/s on loopback): the planner's
    inputs at the start of the run."""
    return rate(), plan_accuracy.measure_mem_bw(), plan_accuracy.measure_gloo_busbw()


RING_BYTES = 16 << 20  # between the models' block units (GPT 12.6 MB, llama 25 MB in fp32)
LINK_CALLS, LINK_MEASUREMENTS = 12, 3  # ring_bus_bandwidth: 36 timed calls, 14 s at 300 Mbit/s


def ring_bus_bandwidth(mbit, n_hosts=4):
    """Bus bandwidth (bytes/s per rank) of Shardline's all-gather over a ring
    of `n_hosts` emulated hosts, one rank each, whose egress is shaped to
    `mbit` (bench/collective_bench across the hosts, RING_BYTES: the median
    of LINK_MEASUREMENTS means of LINK_CALLS calls, each after 2 warm-ups):
    the link as the collectives get it, as nccl-tests' busbw is what a
    planner is given on GPUs. One TCP stream alone gets 1-2% more (its ACKs
    do not queue behind data); a ring's steps also wait for their slowest
    hop. One mean of 3 calls (about a second at 300 Mbit/s) ranged over
    31-36 MB/s at 300 Mbit/s from one run to the next on this VM, where the
    runs' own collectives got 33-34.5; the planner's step time moved with
    that figure by up to 8%."""
    def once():
        with emulated.Hosts(n_hosts) as hs:
            for h in hs:
                hs.limit_egress(h, mbit)
            procs = [h.popen([plan_accuracy.COLL_BENCH, "--launched", "--world", str(n_hosts), "--rank", str(i),
                              "--master", hs[0].address, "--port", str(PORT), "--hostname", h.address,
                              "--min-bytes", str(RING_BYTES), "--max-bytes", str(RING_BYTES), "--rounds", "1",
                              "--iters", str(LINK_CALLS), "--ops", "all_gather"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, h in enumerate(hs)]
            outs = [p.communicate(timeout=300) for p in procs]
            for p, (_, err) in zip(procs, outs):
                if p.returncode != 0:
                    raise harness.RunError(f"collective_bench across hosts: {err.strip()[-300:]}")
            row = [line.split() for line in outs[0][0].splitlines() if line.startswith("all_gather")][0]
            return int(row[1]) / (float(row[2]) * 1e-6) * (n_hosts - 1) / n_hosts  # bytes / time x (n-1)/n
    return statistics.median(once() for _ in range(LINK_MEASUREMENTS))


def planned(job_toml, world, per_host, link, calib, strategy):
    """shardctl plan's step time for `strategy` at this placement over a link
    carrying `link` bytes/s out of each host, and what strategy = "auto"
    picks there (the job file says "auto"; the pick weighs the hybrids with
    the link shared as the coordinator does: common/plan/strategy_choice.h)."""
    flops, mem_bw, busbw = calib
    cores = os.cpu_count() or 1
    share = min(1.0, cores / world)
    # The kernel's TCP work for every byte a rank sends (and its peer
    # receives) runs on the cores the ranks compute on. Gloo's loopback
    # measurement ran plan_accuracy.WORLD ranks on these cores, each sending
    # busbw bytes/s: a byte costs cores / (WORLD x busbw) core-seconds, which
    # a rank pays out of its share of the cores.
    cpu_per_byte = cores / (plan_accuracy.WORLD * busbw) / share

    def plan(inter):
        r = subprocess.run([plan_accuracy.SHARDCTL, "--json", "plan", job_toml, "--workers", str(world),
                            "--gpus-per-node", str(per_host), "--flops", str(flops * share), "--mem-bw",
                            str(mem_bw * share), "--intra-bw", str(busbw), "--inter-bw", str(inter),
                            "--comm-cpu-per-byte", str(cpu_per_byte), "--gpu-memory", "1e12"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise harness.RunError(f"shardctl plan: {r.stderr.strip()}")
        return json.loads(r.stdout)
    out = plan(link)
    auto = out.get("auto", {}).get("strategy", "")
    if strategy.startswith("hybrid"):
        # Its replicate groups, one flow per rank of a host, share the link.
        out = plan(link / per_host)
    return {s["strategy"]: s["step_s"] for s in out["strategies"]}[strategy], auto


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def failed_row(placement, strategy, mbit, sl, pt, why):
    return (f"| {placement} | {strategy} | {mbit} | {len(sl)} runs | {len(pt)} runs | failed: {why[:160]} |"
            + " |" * 13)


def row(placement, strategy, mbit, tokens, sl, pt, plan_s):
    mib = 1 << 20
    sl_tps = [tokens / s["step"] for s in sl]
    pt_tps = [tokens / p["step"] for p in pt]
    ratio = [x / y for x, y in zip(sl_tps, pt_tps)]
    step = statistics.median(s["step"] for s in sl)
    comm = statistics.median(s["comm"] for s in sl)
    exposed = statistics.median(s["exposed"] for s in sl)
    ag, rs, opt = (statistics.median(s[k] for s in sl) for k in ("ag", "rs", "opt"))
    compute = step - exposed
    bound = max(0.0, comm - compute) + 0.1 * step
    return (f"| {placement} | {strategy} | {mbit} | {spread(sl_tps, '{:.0f}')} | {spread(pt_tps, '{:.0f}')} | "
            f"{spread(ratio, '{:.2f}')} | {comm:.2f} | {exposed:.2f} | {ag:.2f} / {rs:.2f} / {exposed - ag - rs:.2f} | "
            f"{compute:.2f} | {opt:.2f} | {bound:.2f} | "
            f"{'yes' if exposed <= bound else 'NO'} | {statistics.median(s['rss'] for s in sl) / mib:.0f} | "
            f"{statistics.median(p['rss'] for p in pt) / mib:.0f} | {plan_s:.2f} | {plan_s / step - 1:+.0%} | "
            f"{sl[-1]['loss']:.4f} | {pt[-1]['loss']:.4f} |")


def cpu_line(placement, strategy, mbit, sl, link):
    """Where the cores went in Shardline's steps (medians of the repeats):
    if every rank's threads together kept the cores busy, the step was bound
    by the CPU, and the transport's CPU came out of some rank's compute. And
    the bus bandwidth the shard group's collectives got in the run, against
    `link`, what its all-gather gets alone (where the group spans hosts)."""
    cores = os.cpu_count() or 1
    ag, rs = (statistics.median(s[k] for s in sl) / 1e6 for k in ("ag_busbw", "rs_busbw"))
    step, cpu = (statistics.median(s[k] for s in sl) for k in ("step", "cpu"))
    compute = statistics.median(s["step"] - s["exposed"] for s in sl)
    thread, other = (statistics.median(s[k] for s in sl) for k in ("cpu_step_thread", "cpu_other"))
    line = (f"- {mbit} Mbit/s, {placement} {strategy}, CPU a step: every rank's threads {cpu:.2f} core-s of the "
            f"{cores} cores' {cores * step:.2f} ({cpu / (cores * step):.0%} busy); per rank, the step thread "
            f"{thread:.2f} s in its {compute:.2f} s of compute, the other threads (transport) {other:.2f} s")
    if strategy.startswith("hybrid") or ag == 0:  # its shard group is a host's (loopback), or one rank
        return line
    return line + (f"; all-gather {ag:.1f} and reduce-scatter {rs:.1f} MB/s bus bandwidth in the run "
                   f"({link / 1e6:.1f} alone)")


HEADER = ("| placement | strategy | Mbit/s | sl_tok/s | pt_tok/s | ratio | comm s | exposed s | AG / RS / AR s | "
          "compute s | optim s | bound s | within | sl_rss MiB | pt_rss MiB | plan s | err | sl_loss | pt_loss |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def plan_cell(a, model, placement, strategy, mbit, link, calib, work):
    """(the planner's step time for the point's job, what auto picks there)."""
    n_hosts, per_host = PLACEMENTS[placement]
    world = n_hosts * per_host
    job = os.path.join(work, "plan-job.toml")
    cfg = shardline_config(a, strategy, world, per_host, model, os.path.join(work, "tokens.bin"))
    # The same job left to strategy = "auto": every strategy's row is planned
    # alike (the hybrids' groups are a host's ranks), and its pick comes too.
    cfg["parallelism"]["strategy"] = "auto"
    cfg["parallelism"].pop("shard_group_size", None)
    cfg["parallelism"]["shard_optimizer_across_replicas"] = a.shard_optimizer_across_replicas
    cfg["train"]["grad_accumulation"] = "sharded"  # the engine's default, which the runs use
    harness.write_toml(cfg, job)
    return planned(job, world, per_host, link, calib, strategy)


def pick_lines(mbit, points):
    """Per placement: what strategy = "auto" picks and the planner's pick
    among the strategies measured, against the fastest measured.
    points: (placement, strategy, measured step, plan step, auto's pick)."""
    lines = []
    for placement in dict.fromkeys(p[0] for p in points):
        here = [p for p in points if p[0] == placement]
        best = min(here, key=lambda p: p[2])[1]
        pick = min(here, key=lambda p: p[3])[1]
        auto = here[0][4]
        verdict = ("agree" if auto == best else "DISAGREE") if auto in {p[1] for p in here} else "auto's not measured"
        lines.append(f"- {mbit} Mbit/s, {placement}: of the strategies measured the planner picks {pick} (auto: "
                     f"{auto}); measured fastest: {best} ({verdict})")
    return lines


def rate_note(rates):
    return (f"planner given {statistics.median(rates) / 1e9:.1f} GFLOP/s per thread "
            f"[{min(rates) / 1e9:.1f}-{max(rates) / 1e9:.1f}]")


def link_line(mbit, link):
    return f"- {mbit} Mbit/s: Shardline's all-gather over 4 shaped hosts gets {link / 1e6:.2f} MB/s bus bandwidth"


def replan(path, a):
    """Recomputes, in place, the plan columns, link lines and pick lines of a
    file of tables saved by --save (one or several sections, each under its
    title line, as bench/results/ keeps them), from the figures each title
    records (a point's FLOP rate where its CPU line records its own) and
    link rates measured now. Everything else is kept."""
    lines = open(path).read().split("\n")
    work = tempfile.mkdtemp(prefix="net-compare-replan-")
    # Each point's own FLOP rate, where its CPU line records one (rate_note).
    rates, title = {}, None
    for n, line in enumerate(lines):
        if "network_compare:" in line and "planner given" in line:
            title = n
        m = re.match(r"- (\d+) Mbit/s, (\w+) (\w+), CPU a step: .*planner given ([\d.]+) GFLOP/s per thread", line)
        if m and title is not None:
            rates[(title, int(m[1]), m[2], m[3])] = float(m[4]) * 1e9
    links, points, title = {}, {}, None  # points: (title line, mbit) -> rows
    for n, line in enumerate(lines):
        if "network_compare:" in line and "planner given" in line:
            title = n
            t = line
            m = re.search(r"planner given ([\d.]+) GFLOP/s per thread[^,]*, ([\d.]+) GB/s memory, ([\d.]+) GB/s", t)
            calib = (float(m[1]) * 1e9, float(m[2]) * 1e9, float(m[3]) * 1e9)
            a.model = re.search(r"network_compare: (\w+)", t)[1]
            lora = re.search(r"LoRA r=(\d+)", t)
            a.lora = int(lora[1]) if lora else 0
            a.sparse_embedding = "with sparse_embedding" in t
            a.shard_optimizer_across_replicas = "optimizer sharded across replicas" in t
            a.batch, T = map(int, re.search(r"global batch (\d+) x (\d+) tokens", t).groups())
            seq = T if T != torch_compare.model_config(a.model, 0)["block_size"] else 0
            model = torch_compare.model_config(a.model, seq)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not (line.startswith("| ") and len(cells) == 19 and cells[2].isdigit()) or title is None:
            continue
        placement, strategy, mbit = cells[0], cells[1], int(cells[2])
        if mbit not in links:
            links[mbit] = ring_bus_bandwidth(mbit)
        step = a.batch * T / float(cells[3].split()[0])
        here = (rates.get((title, mbit, placement, strategy), calib[0]),) + calib[1:]
        plan_s, recommended = plan_cell(a, model, placement, strategy, mbit, links[mbit], here, work)
        cells[15], cells[16] = f"{plan_s:.2f}", f"{plan_s / step - 1:+.0%}"
        points.setdefault((title, mbit), []).append((placement, strategy, step, plan_s, recommended))
        lines[n] = "| " + " | ".join(cells) + " |"
    # The notes under each section: its link and pick lines, anew.
    section = None
    for n, line in enumerate(lines):
        if "network_compare:" in line and "planner given" in line:
            section = n
        link = re.match(r"- (\d+) Mbit/s: ", line)
        pick = re.match(r"- (\d+) Mbit/s, (\w+): of the strategies measured", line)
        if link and int(link[1]) in links:
            lines[n] = link_line(int(link[1]), links[int(link[1])])
        elif pick and (section, int(pick[1])) in points:
            mine = [x for x in pick_lines(int(pick[1]), points[(section, int(pick[1]))])
                    if x.startswith(f"- {pick[1]} Mbit/s, {pick[2]}:")]
            lines[n] = mine[0] if mine else line
    shutil.rmtree(work, True)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt", choices=["gpt", "llama100m"])
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--sparse-embedding", action="store_true",
                    help="Shardline's [parallelism] sparse_embedding")
    ap.add_argument("--shard-optimizer-across-replicas", action="store_true",
                    help="Shardline's [parallelism] shard_optimizer_across_replicas (hybrid_shard points)")
    ap.add_argument("--max-inflight-all-gathers", type=int, default=0,
                    help="Shardline's [prefetch] max_inflight_all_gathers (0: the job's default)")
    ap.add_argument("--points", default="4x1:full_shard,2x2:full_shard,2x2:hybrid_shard",
                    help="placement:strategy pairs")
    ap.add_argument("--mbits", default="100,300,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--trace", default="", help="keep every rank's timeline (shardline-train --trace) in "
                    "DIR/<placement>-<strategy>-<mbit>-<repeat>/")
    ap.add_argument("--save", default="", help="also write the table (markdown) to this file")
    ap.add_argument("--replan", default="", help="recompute the plan columns of a table --save wrote, and exit")
    a = ap.parse_args()
    why = emulated.available()
    if why:
        sys.exit(f"network_compare: emulated hosts unavailable: {why}")
    if a.replan:
        return replan(a.replan, a)
    import torch
    model = torch_compare.model_config(a.model, a.seq)
    T = model["block_size"]
    work = tempfile.mkdtemp(prefix="net-compare-")
    data = os.path.join(work, "tokens.bin")
    torch_compare.write_tokens(data, a.steps * a.batch * T * 2 + 1, model["vocab_size"])
    atexit.register(shutil.rmtree, work, True)
    lora = f", LoRA r={a.lora} (base sharded; PEFT on the PyTorch side)" if a.lora else ""
    lora += ", Shardline with sparse_embedding" if a.sparse_embedding else ""
    lora += ", HSDP's optimizer sharded across replicas" if a.shard_optimizer_across_replicas else ""
    title = (f"# network_compare: {a.model}{lora}, global batch {a.batch} x {T} tokens, fp32, {a.steps - 1} timed "
             f"steps after 1 warm-up, {a.repeats} repeats (median [min-max]), {os.cpu_count()} cores shared by "
             f"every rank, 1 thread per rank; torch {torch.__version__}; egress of every host shaped with tc tbf")
    rate = FlopRate(a, model, work)
    calib = calibrate(rate)
    title += (f"; planner given {calib[0] / 1e9:.1f} GFLOP/s per thread{' (LoRA step)' if a.lora else ''}, "
              f"{calib[1] / 1e9:.1f} GB/s memory, "
              f"{calib[2] / 1e9:.2f} GB/s Gloo loopback (the FLOP rate at the start; each point's, measured "
              f"before each of its repeats, is on its line below)")
    table, notes = [title, "", HEADER], []
    print("\n".join(table), flush=True)

    def save():  # after every row: a long run that stops keeps what it measured
        if a.save:
            with open(a.save, "w") as f:
                f.write("\n".join(table + [""] + notes) + "\n")
    for mbit in [int(m) for m in a.mbits.split(",")]:
        link = ring_bus_bandwidth(mbit)
        notes.append(link_line(mbit, link))
        print(notes[-1], flush=True)
        points = []
        for point in a.points.split(","):
            placement, strategy = point.split(":")
            n_hosts, per_host = PLACEMENTS[placement]
            world = n_hosts * per_host
            sl, pt, rates, cpu = [], [], [], ""
            try:
                for repeat in range(a.repeats):
                    rates.append(rate())
                    with emulated.Hosts(n_hosts) as hs:
                        for h in hs:
                            hs.limit_egress(h, mbit)
                        ranks = rank_hosts(hs, per_host)
                        cfg = shardline_config(a, strategy, world, per_host, model, data)
                        where = os.path.join(a.trace, f"{placement}-{strategy}-{mbit}-{repeat}") if a.trace else ""
                        # Which of the two runs first alternates: on this VM the
                        # second of two runs computes a few percent slower
                        # (network_compare_gpt_sparse.md, "interleaved").
                        runs = [lambda: sl.append(run_shardline(ranks, cfg, a.steps, where)),
                                lambda: pt.append(run_torch(ranks, a, strategy, data))]
                        for run in runs if repeat % 2 == 0 else reversed(runs):
                            run()
                here = (statistics.median(rates),) + calib[1:]
                plan_s, recommended = plan_cell(a, model, placement, strategy, mbit, link, here, work)
                line = row(placement, strategy, mbit, a.batch * T, sl, pt, plan_s)
                points.append((placement, strategy, statistics.median(s["step"] for s in sl), plan_s, recommended))
                cpu = cpu_line(placement, strategy, mbit, sl, link) + "; " + rate_note(rates)
            except harness.RunError as e:  # one side failed: say so, go on with the next point
                line = failed_row(placement, strategy, mbit, sl, pt, str(e))
            table.append(line)
            print(line, flush=True)
            if cpu:
                notes.append(cpu)
                print(cpu, flush=True)
            save()
        notes.extend(pick_lines(mbit, points))
        print("\n".join(pick_lines(mbit, points)), flush=True)
        save()

if __name__ == "__main__":
    main()
