"""What a live `strategy = "auto"` job picks at each point of network_compare's
tables: a real coordinator on an emulated host and four workers on others
(tests/hosts.py), 4 hosts x 1 worker or 2 hosts x 2, every worker host's
egress shaped to the point's bandwidth. The job is network_compare's (the
same model, batch and keys) with strategy = "auto". Its first attempt picks
on the defaults; its ranks then measure the link, their compute and the CPU
a byte sent costs them (worker/run/rendezvous_figures.h), and where the pick
on those figures differs the coordinator restarts it at once. The program
waits for the pick on the measured figures, cancels the job and prints one
row per point: the figures the ranks reported, auto's pick, and the strategy
that measured fastest in the tables (FASTEST below, from
bench/results/network_summary.md).

Needs root (network namespaces). Usage:
    .venv/bin/python bench/auto_picks.py [--models gpt,llama100m,lora] [--mbits 100,300,1000]
        [--placements 4x1,2x2] [--save bench/results/FILE.md]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))

import network_compare as nc  # noqa: E402
from cluster import wait_for  # noqa: E402
from multihost import HostCluster  # noqa: E402

import harness  # noqa: E402  (network_compare put tests/integration on the path)
import hosts as emulated  # noqa: E402
import torch_compare  # noqa: E402

# The models as network_compare ran them: (its --model, --lora, --shard-optimizer-across-replicas).
MODELS = {"gpt": ("gpt", 0, True), "llama100m": ("llama100m", 0, True), "lora": ("llama100m", 16, False)}
# Fastest measured per (model, placement, Mbit/s): the README's "On shaped links" and
# bench/results/network_summary.md (the latest run of every point). At 4x1 only full_shard
# (LoRA: full_shard and no_shard) ran; at 2x2 full_shard and hybrid_shard (LoRA: also no_shard).
# The small GPT at 2x2 and 1000 Mbit/s is a tie, HSDP by 1% in the medians of eight runs that
# alternated which ran first (network_compare_gpt_sparse.md, "interleaved").
FASTEST = {
    ("gpt", "4x1"): {100: "full_shard", 300: "full_shard", 1000: "full_shard"},
    ("gpt", "2x2"): {100: "hybrid_shard", 300: "hybrid_shard", 1000: "hybrid_shard"},
    ("llama100m", "4x1"): {100: "full_shard", 300: "full_shard", 1000: "full_shard"},
    ("llama100m", "2x2"): {100: "hybrid_shard", 300: "hybrid_shard", 1000: "hybrid_shard"},
    ("lora", "4x1"): {100: "no_shard", 300: "no_shard", 1000: "no_shard"},
    ("lora", "2x2"): {100: "no_shard", 300: "no_shard", 1000: "no_shard"},
}
PICK_TIMEOUT = 240  # seconds: two rendezvous and their measurements at 100 Mbit/s


def job_toml(name, per_host, data, directory):
    model_name, lora, soar = MODELS[name]
    a = argparse.Namespace(steps=100000, batch=8, seq=0, max_inflight_all_gathers=0, lora=lora,
                           sparse_embedding=True, shard_optimizer_across_replicas=soar)
    model = torch_compare.model_config(model_name, 0)
    cfg = nc.shardline_config(a, "full_shard", 4, per_host, model, data)
    cfg["job"] = {"name": f"auto-{name}", "workers": 4}
    cfg["parallelism"]["strategy"] = "auto"
    cfg["parallelism"].pop("shard_group_size", None)
    cfg["parallelism"]["shard_optimizer_across_replicas"] = soar
    cfg["train"]["grad_accumulation"] = "sharded"  # the engine's default, which the tables ran
    cfg.pop("checkpoint", None)
    path = os.path.join(directory, f"auto-{name}-{per_host}.toml")
    harness.write_toml(cfg, path)
    return path


def measured_pick(cl, path):
    """(job, why not) once the job runs on a pick made on its ranks' figures."""
    rc, out, err = cl.ctl("submit", path, "--json")
    if rc != 0:
        return None, f"submit: {err.strip()[-200:]}"
    job_id = json.loads(out)["job_id"]
    deadline = time.time() + PICK_TIMEOUT
    try:
        while time.time() < deadline:
            job = cl.ctl_json("status", job_id)
            if job.get("state") in ("FAILED", "SUCCEEDED", "CANCELLED"):
                return job, f"{job['state']}: {job.get('message', '')[:200]}"
            picked_on_figures = "assumed until measured" not in job.get("strategy_reason", "")
            if job.get("state") == "RUNNING" and (job.get("measured_bus_bandwidth") or 0) > 0:
                # Measured: the first attempt runs on if its pick stands (the
                # coordinator restarts it at its last rank's report otherwise).
                time.sleep(3)
                again = cl.ctl_json("status", job_id)
                if again.get("state") == "RUNNING" and (picked_on_figures or len(again.get("attempts", [])) == 1):
                    return again, ""
            time.sleep(0.5)
        return None, f"no pick on measured figures within {PICK_TIMEOUT} s"
    finally:
        cl.ctl("cancel", job_id)


def point(name, placement, mbit, data, directory):
    n_hosts, per_host = nc.PLACEMENTS[placement]
    with emulated.Hosts(n_hosts + 1) as hs:
        cl = HostCluster(list(hs), directory)
        try:
            for h in hs[1:]:
                hs.limit_egress(h, mbit)
                for i in range(per_host):
                    cl.add_worker(h, str(i), collective_timeout=120)
            def idle():
                return len([w for w in cl.ctl_json("workers")["workers"] if w["state"] == "IDLE"]) >= 4
            if not wait_for(idle, 60, "4 idle workers", fail=False):
                return None, "4 workers did not register"
            return measured_pick(cl, job_toml(name, per_host, data, directory))
        finally:
            cl.stop_workers()
            cl.coordinator.terminate()
            cl.coordinator.wait(timeout=15)


HEADER = ("| model | placement | Mbit/s | measured GB/s | GFLOP/s a rank | ns of compute a byte | auto picks | "
          "fastest measured | agree |\n|---|---|---|---|---|---|---|---|---|")


def row(name, placement, mbit, job, why):
    fastest = FASTEST[(name, placement)][mbit]
    if job is None or why:
        return f"| {name} | {placement} | {mbit} | | | | failed: {why} | {fastest} | |"
    pick = job.get("strategy", "")
    return (f"| {name} | {placement} | {mbit} | {job['measured_bus_bandwidth'] / 1e9:.4f} | "
            f"{(job.get('measured_compute_flops') or 0) / 1e9:.1f} | "
            f"{(job.get('measured_comm_cpu_s_per_byte') or 0) * 1e9:.2f} | {pick} | {fastest} | "
            f"{'yes' if pick == fastest else 'NO'} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt,llama100m,lora")
    ap.add_argument("--mbits", default="100,300,1000")
    ap.add_argument("--placements", default="4x1,2x2")
    ap.add_argument("--save", default="")
    a = ap.parse_args()
    why = emulated.available()
    if why:
        sys.exit(f"auto_picks: {why}")
    directory = tempfile.mkdtemp(prefix="auto-picks-")
    data = os.path.join(directory, "tokens.bin")
    torch_compare.write_tokens(data, 1 << 20, 16384)  # (token ids below both models' vocabularies)
    lines = [f"# auto_picks: strategy = \"auto\" jobs on emulated hosts, {os.cpu_count()} cores shared by every "
             "rank; the pick on the figures the ranks measured", "", HEADER]
    print("\n".join(lines), flush=True)
    try:
        for name in a.models.split(","):
            for placement in a.placements.split(","):
                for mbit in [int(m) for m in a.mbits.split(",")]:
                    job, why = point(name, placement, mbit, data, directory)
                    lines.append(row(name, placement, mbit, job, why))
                    print(lines[-1], flush=True)
                    if a.save:
                        with open(a.save, "w") as f:
                            f.write("\n".join(lines) + "\n")
    finally:
        shutil.rmtree(directory, True)


if __name__ == "__main__":
    main()
