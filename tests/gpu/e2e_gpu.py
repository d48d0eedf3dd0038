"""A GPU worker in a real cluster (ctest label gpu; exits 77 without a CUDA
device): a coordinator and a worker on cuda:0 run a job submitted with
shardctl to SUCCEEDED, saving checkpoints; the worker registers its GPU's
memory; the worker's /metrics show its
CUDA memory; the job resumes on two CPU workers from the GPU's checkpoint
(checkpoints are device-independent) and its loss continues where the GPU
run's was; a 2-worker job never takes the GPU worker beside a CPU one."""
import json
import os
import sys
import urllib.request

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from cluster import Checks, Cluster, job_file, wait_for  # noqa: E402

CKPT = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\n'


def metrics_of(cl, host):
    targets = json.loads(urllib.request.urlopen(f"http://{cl.metrics}/sd/workers", timeout=5).read())
    addr = next(t["targets"][0] for t in targets if t["labels"]["shardline_host"] == host)
    return urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()


def main():
    if torch.cuda.device_count() == 0:
        print("no CUDA device: skipped")
        sys.exit(77)
    c = Checks()
    from harness import free_port
    port = free_port()
    cl = Cluster(coordinator_args=["--metrics-port", str(port)])
    cl.metrics = f"127.0.0.1:{port}"
    cl.add_worker("gpu-host", device="cuda:0", args=["--metrics-port", "0"], collective_timeout=60)
    cl.wait_workers(1)
    gpu_worker = next(w for w in cl.ctl_json("workers")["workers"] if w["device"] == "cuda:0")
    total = torch.cuda.get_device_properties(0).total_memory
    c.check(gpu_worker.get("memory_bytes") == total,
            "the GPU worker registers its GPU's total memory (the budget strategy = auto plans with)",
            f"{gpu_worker.get('memory_bytes')} vs torch's {total}")
    rc, out, err = cl.ctl("--json", "submit", job_file(cl.dir, "ongpu", workers=1, steps=10, extra=CKPT, micro=6),
                          "--follow", timeout=300)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    job = lines[0]["job_id"]
    losses = {l["step"]: l["loss"] for l in lines[1:] if l.get("step")}
    c.check(rc == 0 and cl.job(job)["state"] == "SUCCEEDED", "the job on cuda:0 SUCCEEDED", err.strip()[-300:])
    page = metrics_of(cl, "gpu-host")
    mem = {l.split('kind="')[1].split('"')[0]: float(l.split()[-1]) for l in page.splitlines()
           if l.startswith("shardline_memory_bytes{")}
    c.check(mem.get("tensor_peak", 0) > 0 and mem.get("reserved_peak", 0) >= mem.get("tensor_peak", 0),
            "the worker's /metrics show CUDA allocated and reserved peaks", str(mem))

    ckpts = cl.ctl_json("ckpt", "list", job)["checkpoints"]
    c.check([k["step"] for k in ckpts] == [5, 10], "checkpoints at steps 5 and 10", str(ckpts))
    for h in ("cpu-a", "cpu-b"):
        cl.add_worker(h)
    cl.wait_workers(3)
    rc, out, err = cl.ctl("--json", "resume", job, "--from", ckpts[0]["path"], "--workers", "2")
    c.check(rc == 0, "resume on two workers accepted", err.strip())
    resumed = json.loads(out)["job_id"]
    rc, out, err = cl.ctl("--json", "watch", resumed, timeout=300)
    final = cl.job(resumed)
    c.check(rc == 0 and final["state"] == "SUCCEEDED", "the resumed job SUCCEEDED", err.strip()[-300:])
    workers = {w["id"]: w for w in cl.ctl_json("workers")["workers"]}
    devices = sorted(workers[w]["device"] for w in final.get("worker_ids", []) if w in workers)
    c.check(devices == ["cpu", "cpu"], "it ran on the two CPU workers, never beside the GPU", str(devices))
    # fp32 on both devices: the curve continues within the CPU/GPU tolerance.
    rel = abs(final["loss"] - losses[10]) / losses[10]
    c.check(rel < 1e-4, "its loss at step 10 matches the GPU run's", f"{final['loss']:.6f} vs {losses[10]:.6f}")
    c.finish()


if __name__ == "__main__":
    main()
