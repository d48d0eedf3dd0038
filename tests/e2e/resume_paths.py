"""What a resume reads is what was checked, and reading it is bounded.

- User B submits `--resume-from LINK`, LINK a symlink to B's own step 5,
  while the job waits for workers; B re-points LINK at user A's step 10
  before the job starts. The job records B's real step directory (the link
  resolved at submit, where the owner was checked), trains from B's step 5
  (its first computed step is 6, and its loss there is B's, not A's), and
  A's files are untouched.
- A step directory whose real path changes after the submit (its folder
  swapped for a link to A's while the job waits) fails the job at its start
  with a one-line message naming the path, on the worker that would read it.
- A step directory whose manifest.json is a sparse 8 GiB file: `submit
  --resume-from` is refused by shardctl in one line naming the file and the
  limit, and, sent straight to the coordinator (the hostile client's own
  SubmitJob), refused there too: the coordinator stays up and small."""
import json
import os
import shutil
import signal

from cluster import Checks, Cluster, job_file, rss_mib, wait_for

CKPT = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\n'


def main():
    c = Checks()
    cl = Cluster(token="user-a", worker_token="worker-token")
    cl.secret_file("token", "user-a\nuser-b")
    cl.coordinator.send_signal(signal.SIGHUP)
    b_token = cl.secret_file("b-token", "user-b")
    as_b = lambda *a, **kw: cl.ctl("--token-file", b_token, *a, token=False, **kw)
    wait_for(lambda: as_b("jobs")[0] == 0, 10, "user B's token")

    def b_status(job, *more):
        rc, out, err = as_b("--json", "status", job, *more)
        return json.loads(out) if rc == 0 else {"state": "?", "message": err}
    cl.add_worker("host-a")
    cl.add_worker("host-b")
    cl.wait_workers(2)

    a_dir = os.path.join(cl.dir, "a")
    b_dir = os.path.join(cl.dir, "b")
    for d in (a_dir, b_dir):
        os.makedirs(d)
    rc, out, err = cl.ctl("--json", "submit", job_file(a_dir, "a-job", steps=10, extra=CKPT), "--follow", timeout=120)
    a_job = json.loads(out.splitlines()[0])["job_id"]
    rc, out, err = as_b("--json", "submit", job_file(b_dir, "b-job", steps=5, extra=CKPT), "--follow", timeout=120)
    b_job = json.loads(out.splitlines()[0])["job_id"]
    a_step = os.path.join(a_dir, "ckpt", a_job, "step-00000010")
    b_step = os.path.join(b_dir, "ckpt", b_job, "step-00000005")
    c.check(os.path.isdir(a_step) and os.path.isdir(b_step), "A's step 10 and B's step 5 are committed")
    a_files = sorted(os.listdir(a_step))

    # A job of three workers waits (two registered) while B re-points the link.
    link = os.path.join(b_dir, "latest")
    os.symlink(b_step, link)
    rc, out, err = as_b("--json", "submit", job_file(b_dir, "b-resume", workers=3, steps=8), "--resume-from", link)
    resumed = json.loads(out)["job_id"] if rc == 0 else ""
    c.check(rc == 0, "B submits a resume through a link to B's own step 5", err.strip())
    os.unlink(link)
    os.symlink(a_step, link)
    cl.add_worker("host-c")
    end = wait_for(lambda: (lambda j: j["state"] in ("SUCCEEDED", "FAILED") and j)(b_status(resumed, "--history"))
                   if resumed else {"state": "none"}, 120, "B's resumed job to end")
    history = end.get("history", [])
    own = [h for h in history if h.get("step", 0) > 5]
    c.check(end["state"] == "SUCCEEDED" and (end.get("resumed_from") or {}).get("path") == os.path.realpath(b_step)
            and (end.get("resumed_from") or {}).get("step") == 5,
            "the job records and reads B's real step directory, not where the link points now",
            f"{end['state']} {end.get('message', '')[:160]} {end.get('resumed_from')}")
    c.check(own and own[0]["step"] == 6, "its first computed step is 6 (from B's step 5, not A's 10)",
            str([h.get("step") for h in history][:12]))
    c.check(sorted(os.listdir(a_step)) == a_files, "A's checkpoint is untouched")

    # The step folder itself swapped for a link while the job waits: the
    # worker that would read it refuses, naming the path.
    copy = os.path.join(b_dir, "copy-of-step-5")
    shutil.copytree(b_step, copy)
    rc, out, err = as_b("--json", "submit", job_file(b_dir, "b-swapped", workers=4, steps=8), "--resume-from", copy)
    swapped = json.loads(out)["job_id"] if rc == 0 else ""
    shutil.rmtree(copy)
    os.symlink(a_step, copy)
    cl.add_worker("host-d")
    end = wait_for(lambda: (lambda j: j["state"] in ("SUCCEEDED", "FAILED") and j)(b_status(swapped))
                   if swapped else {"state": "none", "message": err}, 120, "the swapped job to end")
    c.check(end["state"] == "FAILED" and f"resume_from {copy} now leads to {os.path.realpath(a_step)}" in end["message"]
            and "refused" in end["message"], "a step folder swapped for a link after the submit: the job fails, naming it",
            end.get("message", "")[:300])

    # A manifest of 8 GiB (sparse): refused in one line, never read.
    huge = os.path.join(b_dir, "huge-step")
    shutil.copytree(b_step, huge)
    with open(os.path.join(huge, "manifest.json"), "r+b") as f:
        f.truncate(8 << 30)
    before = rss_mib(cl.coordinator.pid)
    rc, _, err = as_b("submit", job_file(b_dir, "b-huge", steps=8), "--resume-from", huge)
    c.check(rc == 1 and "manifest.json: larger than 16777216 bytes: refused" in err and len(err.strip().splitlines()) == 1,
            "shardctl refuses an 8 GiB manifest in one line", err.strip())
    # Past shardctl's own check (--skip-local-check sends the file and the
    # path as they are): the coordinator's to refuse.
    rc, _, err = as_b("submit", job_file(b_dir, "b-huge", steps=8), "--resume-from", huge, "--skip-local-check")
    c.check(rc == 1 and "larger than 16777216 bytes" in err and cl.coordinator.poll() is None
            and rss_mib(cl.coordinator.pid) < before + 64,
            "the coordinator refuses it too, and stays up and small",
            f"{err.strip()} rss {before:.0f} -> {rss_mib(cl.coordinator.pid):.0f} MiB")
    c.finish()


if __name__ == "__main__":
    main()
