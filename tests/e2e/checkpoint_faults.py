"""kill -9 of a worker during a checkpoint, at three points: before it wrote
its shard, in the middle of writing it, and after writing it but before
reporting it. Each time the last committed checkpoint stays intact (manifest
and checksums verify), the interrupted one has no manifest and is removed once
the job's ranks stopped, and a resume from the latest committed checkpoint
runs."""
import json
import os

from cluster import Checks, Cluster, job_file, wait_for

CKPT = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\nkeep_latest = 0\n'


def main():
    c = Checks()
    for point in ("before-write", "mid-write", "before-report"):
        cl = Cluster()
        cl.add_worker("host-a")
        cl.add_worker("host-b", env={"SHARDLINE_FAULT": f"{point}@10"})
        cl.wait_workers(2)
        rc, out, _ = cl.ctl("--json", "submit", job_file(cl.dir, "victim", workers=2, steps=1000000, extra=CKPT))
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
