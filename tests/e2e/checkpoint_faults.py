"""kill -9 of a worker during a checkpoint, at three points: before it wrote
its shard, in the middle of writing it, and after writing it but before
reporting it. Each time the last committed checkpoint stays intact (manifest
and checksums verify), the interrupted one has no manifest and is removed once
the job's ranks stopped, and a resume from the latest committed checkpoint
runs.

The last step is always saved ([checkpoint] at_end, the default): a job of
221 steps saving every 100 ends with step 221 committed, and it exports;
submit says how many steps it resolved; a job whose last step an interval
already saved saves it once; a worker killed during the final save
(mid-write@221) sends the job RESTARTING, and it resumes from step 200 and
commits 221 before it SUCCEEDS.

kill -9 of the coordinator in the middle of a prune (SHARDLINE_FAULT=mid-prune,
server/fault_injection.h: the commit of step 4 with keep_latest = 1 recorded
that step 2 is dropped, and the coordinator dies before removing it). Started
again on the same --state-dir, `ckpt list` shows only step directories that
exist with their manifest, and a plain `resume` starts from the newest
committed step and SUCCEEDS."""
import json
import os
import subprocess

from cluster import Checks, Cluster, job_file, wait_for

CKPT = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\nkeep_latest = 0\n'


def kill_during_prune(c):
    os.environ["SHARDLINE_FAULT"] = "mid-prune@4"  # the coordinator's environment only
    try:
        cl = Cluster()
    finally:
        del os.environ["SHARDLINE_FAULT"]
    cl.add_worker("host-a")
    cl.add_worker("host-b")
    cl.wait_workers(2)
    ckpt = '\n[checkpoint]\ndir = "ckpt"\ninterval = 2\nkeep_latest = 1\n'
    job = cl.ctl_json("submit", job_file(cl.dir, "pruned", workers=2, steps=40, restarts=0, extra=ckpt))["job_id"]
    try:
        code = cl.coordinator.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    c.check(code == -9, "mid-prune: the coordinator killed itself (SIGKILL) during the prune after step 4",
            cl.coordinator_log().strip()[-200:] if code is not None else "still running")
    root = os.path.join(cl.dir, "ckpt", job)
    print(f"on disk after the kill: {sorted(os.listdir(root))}", flush=True)
    cl.start_coordinator()  # the same port and --state-dir
    wait_for(lambda: cl.job(job)["state"] == "FAILED", 30, "the recovered job to end (max_restarts = 0)")
    ckpts = cl.ctl_json("ckpt", "list", job)["checkpoints"]
    listed = [k["step"] for k in ckpts]
    c.check(listed == [4] and all(os.path.isfile(os.path.join(k["path"], "manifest.json")) for k in ckpts),
            "after the restart `ckpt list` shows only step 4, which exists with its manifest", str(ckpts))
    rc, out, err = cl.ctl("--json", "resume", job)
    resumed = json.loads(out)["job_id"] if rc == 0 else None
    c.check(rc == 0, "a plain resume is accepted", err.strip())
    if resumed:
        ok = wait_for(lambda: cl.job(resumed)["state"] in ("SUCCEEDED", "FAILED"), 120, "the resumed job", fail=False)
        j = cl.job(resumed)
        first = j["attempts"][0]["first_step"] if j["attempts"] else None
        c.check(ok and j["state"] == "SUCCEEDED" and first == 4 and j["step"] == 40,
                "the resumed job starts from step 4 (the newest committed) and SUCCEEDS",
                f"{j['state']} from step {first} to {j['step']}: {j['message']}")


def saves(cl, job):
    """How many times rank 0 saved its shard in `job` (its log lines)."""
    _, out, _ = cl.ctl("logs", job, "--rank", "0")
    return out.count("saved its shard")


def last_step_saved(c):
    cl = Cluster()
    cl.add_worker("host-a")
    cl.add_worker("host-c")
    cl.wait_workers(2)
    every_100 = '\n[checkpoint]\ndir = "ckpt"\ninterval = 100\n'
    rc, out, err = cl.ctl("submit", job_file(cl.dir, "long", workers=2, steps=221, extra=every_100), "--follow",
                          timeout=180)
    job = out.splitlines()[0].strip() if out else ""
    c.check(rc == 0 and f"{job}: 221 steps" in err, "submit says the steps it resolved", err.strip()[-200:])
    ckpts = [k["step"] for k in cl.ctl_json("ckpt", "list", job)["checkpoints"]]
    c.check(ckpts == [100, 200, 221], "221 steps saving every 100: the last step is committed too", str(ckpts))
    step_dir = os.path.join(cl.dir, "ckpt", job, "step-00000221")
    rc, _, err = cl.ctl("ckpt", "export", step_dir, "--out", os.path.join(cl.dir, "last.safetensors"))
    c.check(rc == 0 and os.path.getsize(os.path.join(cl.dir, "last.safetensors")) > 0,
            "the last step exports", err.strip())
    c.check(saves(cl, job) == 3, "rank 0 saved three times", str(saves(cl, job)))

    every_10 = '\n[checkpoint]\ndir = "ckpt"\ninterval = 10\n'
    rc, out, err = cl.ctl("submit", job_file(cl.dir, "even", workers=2, steps=20, extra=every_10), "--follow",
                          timeout=120)
    job = out.splitlines()[0].strip() if out else ""
    ckpts = [k["step"] for k in cl.ctl_json("ckpt", "list", job)["checkpoints"]] if job else []
    c.check(rc == 0 and ckpts == [10, 20] and saves(cl, job) == 2,
            "a last step the interval saved is saved once", f"{ckpts}, {saves(cl, job) if job else 0} saves")

    # host-b sorts before host-c: the next 2-worker job takes host-a and host-b.
    cl.add_worker("host-b", env={"SHARDLINE_FAULT": "mid-write@221"})
    cl.wait_workers(3)
    job = cl.ctl_json("submit", job_file(cl.dir, "killed", workers=2, steps=221, extra=every_100))["job_id"]
    end = wait_for(lambda: cl.job(job)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and cl.job(job), 180,
                   "the job whose final save was killed to end")
    c.check(cl.workers["host-b"].wait(timeout=10) == -9, "a worker was killed during the final save")
    ckpts = [k["step"] for k in cl.ctl_json("ckpt", "list", job)["checkpoints"]]
    c.check(end["state"] == "SUCCEEDED" and ckpts == [100, 200, 221],
            "killed during its final save, the job restarted from step 200 and committed step 221",
            f"{end['state']} {end['message']}; committed {ckpts}; attempts {len(end.get('attempts', []))}")
    c.check(len(end.get("attempts", [])) >= 2, "it took a second attempt", str(end.get("attempts", []))[:200])


def main():
    c = Checks()
    last_step_saved(c)
    kill_during_prune(c)
    for point in ("before-write", "mid-write", "before-report"):
        cl = Cluster()
        cl.add_worker("host-a")
        cl.add_worker("host-b", env={"SHARDLINE_FAULT": f"{point}@10"})
        cl.wait_workers(2)
        victim = job_file(cl.dir, "victim", workers=2, steps=1000000, restarts=0, extra=CKPT)  # fails, no restart
        rc, out, _ = cl.ctl("--json", "submit", victim)
        job = json.loads(out)["job_id"]
        wait_for(lambda: cl.job(job)["state"] == "FAILED", 60, "the job to fail when the worker dies")
        c.check(cl.workers["host-b"].wait(timeout=10) == -9, f"{point}: the worker was killed")
        ckpts = cl.ctl_json("ckpt", "list", job)["checkpoints"]
        c.check([k["step"] for k in ckpts] == [5], f"{point}: only step 5 is committed", str(ckpts))
        root = os.path.join(cl.dir, "ckpt", job)
        committed = os.path.join(root, "step-00000005")
        c.check(sorted(os.listdir(committed)) == ["manifest.json", "rank-00000.safetensors", "rank-00001.safetensors"],
                f"{point}: the committed checkpoint is intact")
        partial = os.path.join(root, "step-00000010")
        c.check(not os.path.exists(os.path.join(partial, "manifest.json")), f"{point}: the interrupted one has no manifest")
        cl.wait_workers(1)  # the survivor stopped: nothing writes into the job's directory any more
        gone = wait_for(lambda: not os.path.exists(partial), 10, "the interrupted save's removal", fail=False)
        c.check(gone, f"{point}: the ended job's interrupted save is removed",
                str(sorted(os.listdir(partial))) if os.path.isdir(partial) else "")
        rc, out, err = cl.ctl("--json", "resume", job, "--workers", "1")
        resumed = json.loads(out)["job_id"] if rc == 0 else None
        c.check(rc == 0, f"{point}: resume from the latest committed checkpoint accepted", err.strip())
        if resumed:
            wait_for(lambda: cl.job(resumed)["step"] > 6 or cl.job(resumed)["state"] == "FAILED", 60, "progress")
            j = cl.job(resumed)
            c.check(j["state"] == "RUNNING" and j["step"] > 6, f"{point}: the resumed job trains past step 5",
                    f"{j['state']} step {j['step']} {j['message']}")
            cl.ctl("cancel", resumed)
    c.finish()


if __name__ == "__main__":
    main()
